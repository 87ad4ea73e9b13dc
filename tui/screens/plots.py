"""Live plots: temperature, power against the limit, per GPU and CPU package, over the last minutes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.widgets import Static

from aithermctl.document import overview
from aithermctl.screens.base import DataScreen
from aithermctl.state import TuiState
from aithermctl.widgets.trace_plot import TracePlot

SPANS = (60.0, 120.0, 300.0, 600.0)
TALL_ROWS = 40


class PlotsScreen(DataScreen):
    BINDINGS = [Binding("plus,equals_sign", "zoom(-1)", "Shorter", show=True),
                Binding("minus", "zoom(1)", "Longer", show=True)]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="plots-body"):
            yield Static("", id="plots-empty")
            yield Grid(id="plots")

    def on_resize(self) -> None:
        plots = self.query_one("#plots")
        plots.set_class(self.size.width >= 120, "wide")  # temperature | power per row
        # 40 rows and more: taller plots, and each GPU's utilization, memory and fan plots too
        tall = self.size.height >= TALL_ROWS
        if tall != plots.has_class("tall"):
            plots.set_class(tall, "tall")
            self.show(self.app.state)  # type: ignore[attr-defined]

    def action_zoom(self, step: int) -> None:
        state: TuiState = self.app.state  # type: ignore[attr-defined]
        i = min(range(len(SPANS)), key=lambda k: abs(SPANS[k] - state.span_s))
        state.span_s = SPANS[max(0, min(len(SPANS) - 1, i + step))]
        self.show(state)

    def _plots(self, state: TuiState) -> list[tuple[str, str, str, str | None, float, str]]:
        """(widget id, title, channel id, limit knob id, full-scale floor, unit) for each plot."""
        if state.doc is None:
            return []
        ov = overview(state.doc)
        tall = self.query_one("#plots").has_class("tall")
        out = []
        for g in ov.gpus:
            out.append((f"plot-{g.id}-temp", f"{g.id} temperature", f"{g.id}/temperature", None,
                        g.slowdown_c or 90.0, "°C"))
            out.append((f"plot-{g.id}-power", f"{g.id} power", f"{g.id}/power", f"{g.id}/power_limit",
                        g.limit_w or 100.0, "W"))
            if tall:
                out.append((f"plot-{g.id}-util", f"{g.id} utilization", f"{g.id}/utilization", None,
                            100.0, "%"))
                out.append((f"plot-{g.id}-mem", f"{g.id} memory busy", f"{g.id}/memory_utilization", None,
                            100.0, "%"))
                if state.history.window(f"{g.id}/fan0", state.span_s):  # its speed, and the duty asked
                    out.append((f"plot-{g.id}-fan", f"{g.id} fan", f"{g.id}/fan0", f"{g.id}/fan0", 100.0, "%"))
        for p in ov.packages:
            safe = p.id.replace(":", "-")
            out.append((f"plot-{safe}-power", f"{p.name} power", f"{p.id}/power", f"{p.id}/pl1",
                        p.pl1_w or 50.0, "W"))
        return out

    def show_body(self, state: TuiState) -> None:
        plots = self._plots(state)
        grid = self.query_one("#plots", Grid)
        existing = {w.id: w for w in grid.query(TracePlot)}
        wanted = {p[0] for p in plots}
        for wid, widget in existing.items():
            if wid not in wanted:
                widget.remove()
        for wid, title, key, limit, floor, unit in plots:
            widget = existing.get(wid)
            if widget is None:
                widget = TracePlot(title, unit, id=wid)
                grid.mount(widget)
            line = state.history.window(limit, state.span_s, knob=True) if limit else ()
            widget.set_series(state.history.window(key, state.span_s), line, span_s=state.span_s, floor=floor)
        self.query_one("#plots-empty", Static).update("" if plots else "Nothing to plot yet.")
