"""GpuCard: one GPU's temperature, power against its limit, utilization, fans, memory in use, clock-event
reasons, the rule that set its limit, and a card held high while idle."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from aithermctl.document import GpuView, fmt
from aithermctl.processes import gib
from aithermctl.widgets.gauge import gauge, ratio

LABEL = 16  # width of the left column


def card_text(view: GpuView, width: int, memory: tuple[int | None, int | None] | None = None,
              processes: int | None = None, compact: bool = False) -> Text:
    """The card body for a content area ``width`` cells wide; ``memory`` (used, total bytes) and the number
    of ``processes`` where the daemon accounts them. ``compact``: two gauges a line (three lines where the
    full card has five), for a screen too short for the full one."""
    text = Text()
    rows: list[tuple[str, float | None, str, float, float]] = []
    slowdown = view.slowdown_c
    rows.append((fmt(view.temp_c, "°C"), ratio(view.temp_c, slowdown or 90.0),
                 f"slowdown {fmt(slowdown, '°C')}" if slowdown else "", 0.85, 0.97))
    rows.append((f"{fmt(view.power_w)}/{fmt(view.limit_w, 'W')}", ratio(view.power_w, view.limit_w),
                 f"{fmt(view.limit_min_w)}–{fmt(view.limit_max_w, 'W')}", 0.9, 0.98))
    fans = " ".join(fmt(f.pct, "%") for f in view.fans) or "—"
    rows.append((f"util {fmt(view.util_pct, '%')}", ratio(view.util_pct, 100.0), f"fans {fans}", 2.0, 2.0))
    if memory is not None and memory[1]:
        used, total = memory
        procs = "" if processes is None else f"{processes} process{'' if processes == 1 else 'es'}"
        rows.append((f"mem {gib(used)}/{gib(total)}G", ratio(used, total), procs, 0.9, 0.97))
    if compact:
        half = (width - 2) // 2
        label_w = max(len(r[0]) for r in rows) + 1
        tail_w = max(len(r[2]) for r in rows)
        bar_w = max(3, half - label_w - tail_w - 1)
        for i, (label, fraction, tail, warn, alert) in enumerate(rows):
            text.append(label.ljust(label_w))
            text.append_text(gauge(fraction, bar_w, warn, alert))
            text.append(f" {tail}".ljust(half - label_w - bar_w) + ("  " if i % 2 == 0 else "\n"))
        if len(rows) % 2:
            text.append("\n")
    else:
        bar_w = max(4, min(40, width - LABEL - 18))
        for label, fraction, tail, warn, alert in rows:
            text.append(label.ljust(LABEL)[:LABEL])
            text.append_text(gauge(fraction, bar_w, warn, alert))
            text.append(f" {tail}\n")
    text.append("limit ", style="dim")
    text.append(view.rule or "default (no rule)", style="bold cyan" if view.rule else "dim")
    if view.default_w is not None and view.limit_w is not None and abs(view.limit_w - view.default_w) > 0.5:
        sign = "+" if view.limit_w > view.default_w else "−"
        text.append(f"  {sign}{fmt(abs(view.limit_w - view.default_w), 'W')} vs default", style="dim")
    if view.reasons:
        limit_len = len(text.plain) - text.plain.rfind("\n") - 1
        one_line = limit_len + 10 + sum(len(r) + 2 for r in view.reasons) <= width
        text.append("  clocks " if one_line else "\nclocks ", style="dim")
        worrying = set(view.reasons) - {"idle", "gpu_idle", "none"}
        text.append(", ".join(view.reasons), style="yellow" if worrying else "")
    if view.held_idle:
        h = view.held_idle
        text.append(f"\nheld high while idle: {fmt(h.get('excess_w'), 'W')} over its floor", style="yellow")
    for problem in view.problems:
        text.append(f"\n! {problem}", style="bold red")
    return text


class GpuCard(Widget):
    """Renders :class:`~aithermctl.document.GpuView`; set :attr:`view` to update."""

    DEFAULT_CSS = "GpuCard { height: auto; border: round $accent; padding: 0 1; }"
    view: reactive[GpuView | None] = reactive(None, layout=True)
    memory: reactive[tuple[int | None, int | None] | None] = reactive(None, layout=True)
    processes: reactive[int | None] = reactive(None)
    compact: reactive[bool] = reactive(False, layout=True)

    def watch_view(self, view: GpuView | None) -> None:
        if view is not None:
            self.border_title = f"{view.id} · {view.name}"

    def render(self) -> Text:
        if self.view is None:
            return Text("waiting for the daemon…", style="dim")
        return card_text(self.view, self.content_size.width or 60, self.memory, self.processes, self.compact)
