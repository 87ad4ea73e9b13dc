"""Live plots: temperature, power against the limit, per GPU and CPU package, over the last minutes.

On a wide screen plots come by what they show, then by device, a column per GPU (as many as fit): the GPUs'
temperatures, their powers, and on a tall screen their utilization, memory and fans; the CPU packages'
power last. One plot a row, they come by device: each GPU's together.
"""

from __future__ import annotations

from typing import NamedTuple

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
MIN_PLOT_COLS = 45  # a plot's width on a wide screen, at the least


class Plot(NamedTuple):
    """A plot: widget id, title, channel id, limit knob id (drawn as a line), full-scale floor, unit."""

    wid: str
    title: str
    key: str
    limit: str | None
    floor: float
    unit: str


def plot_specs(state: TuiState, *, tall: bool = False, kinds: tuple[str, ...] | None = None,
               by_device: bool = False) -> list[Plot]:
    """The plots of ``state``'s document in order (see the module docstring); ``tall`` adds utilization,
    memory and fan plots; ``kinds`` keeps only those ("temp", "power", ...); ``by_device``: one GPU's plots
    together, then the next's (one plot a row)."""
    if state.doc is None:
        return []
    ov = overview(state.doc)
    out: dict[str, list[Plot]] = {"temp": [], "power": [], "util": [], "mem": [], "fan": [], "cpu": []}
    for g in ov.gpus:
        out["temp"].append(Plot(f"plot-{g.id}-temp", f"{g.id} temperature", f"{g.id}/temperature", None,
                                g.slowdown_c or 90.0, "°C"))
        out["power"].append(Plot(f"plot-{g.id}-power", f"{g.id} power", f"{g.id}/power",
                                 f"{g.id}/power_limit", g.limit_w or 100.0, "W"))
        if tall:
            out["util"].append(Plot(f"plot-{g.id}-util", f"{g.id} utilization", f"{g.id}/utilization", None,
                                    100.0, "%"))
            out["mem"].append(Plot(f"plot-{g.id}-mem", f"{g.id} memory busy", f"{g.id}/memory_utilization",
                                   None, 100.0, "%"))
            if state.history.window(f"{g.id}/fan0", state.span_s):  # its speed, and the duty asked
                out["fan"].append(Plot(f"plot-{g.id}-fan", f"{g.id} fan", f"{g.id}/fan0", f"{g.id}/fan0",
                                       100.0, "%"))
    for p in ov.packages:
        safe = p.id.replace(":", "-")
        out["cpu"].append(Plot(f"plot-{safe}-power", f"{p.name} power", f"{p.id}/power", f"{p.id}/pl1",
                               p.pl1_w or 50.0, "W"))
    ordered = [plot for kind, plots in out.items() if kinds is None or kind in kinds for plot in plots]
    if by_device:  # stable: within a device, temperature, power, utilization, memory, fan
        devices = [g.id for g in ov.gpus]
        ordered.sort(key=lambda p: devices.index(p.key.split("/")[0]) if p.key.split("/")[0] in devices
                     else len(devices))
    return ordered


def show_plots(grid: Grid, plots: list[Plot], state: TuiState, hint: str = "") -> None:
    """Make ``grid`` hold exactly ``plots``, in their order (a plot added later goes to its place, not to
    the end), each with its series from ``state`` (``hint``: keys, after the scale)."""
    existing = {w.id: w for w in grid.query(TracePlot)}
    wanted = {p.wid for p in plots}
    for wid, widget in list(existing.items()):
        if wid not in wanted:
            widget.remove()
            del existing[wid]
    new = [TracePlot(p.title, p.unit, id=p.wid) for p in plots if p.wid not in existing]
    if new:
        grid.mount_all(new)
        existing.update((w.id, w) for w in new)
    if [w.id for w in grid.query(TracePlot) if w.id in wanted] != [p.wid for p in plots]:
        for before, after in zip(plots, plots[1:], strict=False):
            grid.move_child(existing[after.wid], after=existing[before.wid])
    for p in plots:
        line = state.history.window(p.limit, state.span_s, knob=True) if p.limit else ()
        existing[p.wid].set_series(state.history.window(p.key, state.span_s), line, span_s=state.span_s,
                                   floor=p.floor, hint=hint)


class PlotsScreen(DataScreen):
    # each plot's subtitle names these keys: the footer keeps q Quit on 80 columns
    BINDINGS = [Binding("plus,equals_sign", "zoom(-1)", "Shorter", show=False),
                Binding("minus", "zoom(1)", "Longer", show=False)]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="plots-body"):
            yield Static("", id="plots-empty")
            yield Grid(id="plots")

    def on_resize(self) -> None:
        plots = self.query_one("#plots")
        wide = self.size.width >= 120  # two plots a row
        if wide != plots.has_class("wide"):
            plots.set_class(wide, "wide")
            self.show(self.app.state)  # type: ignore[attr-defined]
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

    def show_body(self, state: TuiState) -> None:
        grid = self.query_one("#plots", Grid)
        wide = grid.has_class("wide")
        plots = plot_specs(state, tall=grid.has_class("tall"), by_device=not wide)
        gpus = sum(1 for p in plots if p.wid.endswith("-temp"))  # a column per GPU, as many as fit
        grid.styles.grid_size_columns = max(2, min(gpus, self.size.width // MIN_PLOT_COLS)) if wide else 1
        show_plots(grid, plots, state, hint="+/- zoom")
        empty = self.query_one("#plots-empty", Static)
        empty.update("" if plots else "Nothing to plot yet.")
        empty.display = not plots
