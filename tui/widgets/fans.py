"""BoardFans: every fan (board fan inputs and GPU fans alike) with its speed (RPM), duty (%), what drives
it, and its alarm (stalled, empty, blind, conflict, uncontrollable) in place of the speed.

One fan a line under a header where the screen has room; where it has not (80×24 with two GPU cards),
``compact``: several fans a line, each named by its chip without the bus address (``nct6798 fan1``), the
source most of them share in the title and any other after the fan it drives. Every board fan is shown in
both; compact leaves the GPU fans to the GPU cards above (``fans 34%``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from aithermctl.document import BoardFanView, fmt

GAP = 3  # cells between two fans on a line (compact)


def _speed(f: BoardFanView) -> str:
    return fmt(f.rpm, "RPM") if f.status == "ok" else f"! {f.status}"


def short_label(label: str) -> str:
    """``nct6798-isa-0290 fan1`` → ``nct6798 fan1`` (the chip without its bus and address)."""
    chip, _, rest = label.partition(" ")
    return f"{chip.split('-', 1)[0]} {rest}" if rest else label


def common_source(fans: Sequence[BoardFanView]) -> str:
    """The source most fans share ("" when none has one)."""
    counts = Counter(f.source for f in fans if f.source)
    return counts.most_common(1)[0][0] if counts else ""


def fans_text(fans: Sequence[BoardFanView], width: int, compact: bool) -> Text:
    """The fans as text ``width`` cells wide (see the module docstring)."""
    text = Text()
    if not fans:
        return Text("no fan", style="dim")
    if not compact:
        w = max(len(f.label) for f in fans)
        ws = max(5, *(len(_speed(f)) for f in fans))
        text.append(f"{'fan':<{w}}  {'speed':<{ws}}  duty  source\n", style="bold")
        for i, f in enumerate(fans):
            text.append(f"{f.label:<{w}}  ")
            text.append(f"{_speed(f):<{ws}}", style="" if f.status == "ok" else "bold red")
            text.append(f"  {fmt(f.duty_pct, '%'):<4}  {f.source}" + ("\n" if i < len(fans) - 1 else ""))
        return text
    entries, widths = compact_layout(fans, width)
    per_line = len(widths)
    for i, (label, speed, rest, ok) in enumerate(entries):
        col = i % per_line
        if i and col == 0:
            text.append("\n")
        elif i:
            text.append(" " * GAP)
        text.append(label)
        text.append(speed, style="" if ok else "bold red")
        last = col == per_line - 1 or i == len(entries) - 1
        text.append(rest if last else rest.ljust(widths[col] - len(label) - len(speed)))
    return text


def compact_layout(fans: Sequence[BoardFanView], width: int) -> tuple[list[tuple[str, str, str, bool]],
                                                                         list[int]]:
    """The compact entries (label, speed, the rest, speed ok) and the width of each column: as many columns
    as fit ``width``, each as wide as its own widest entry (one fan whose source is spelled out, such as
    ``firmware (no pwm)``, widens its column only). Lines: ``ceil(len(entries) / len(widths))``."""
    fans = [f for f in fans if not f.id.startswith("gpu")] or fans  # compact: on the GPU cards already
    common = common_source(fans)
    wl = max(len(short_label(f.label)) for f in fans)
    ws = max(len(_speed(f)) for f in fans)
    entries = []
    for f in fans:
        tail = f" {f.source}" if f.source and f.source != common else ""
        entries.append((f"{short_label(f.label):<{wl}} ", f"{_speed(f):>{ws}}",
                        f" {fmt(f.duty_pct, '%'):>4}{tail}", f.status == "ok"))
    sizes = [len(a) + len(b) + len(c) for a, b, c, _ in entries]
    for per_line in range(len(entries), 1, -1):
        widths = [max(sizes[j::per_line]) for j in range(per_line)]
        if sum(widths) + GAP * (per_line - 1) <= width:
            return entries, widths
    return entries, [max(sizes)]


class BoardFans(Widget):
    """Set :meth:`show`; ``compact`` packs several fans a line (set by the overview from its height)."""

    DEFAULT_CSS = "BoardFans { height: auto; border: round $secondary; padding: 0 1; }"
    fans: reactive[tuple[BoardFanView, ...]] = reactive((), layout=True)
    compact: reactive[bool] = reactive(False, layout=True)

    def on_mount(self) -> None:
        self._title()

    def show(self, fans: tuple[BoardFanView, ...]) -> None:
        self.fans = fans
        self._title()

    def watch_compact(self) -> None:
        self._title()

    def _title(self) -> None:
        common = common_source(self.fans) if self.compact else ""
        self.border_title = f"Fans · {common}" if common else "Fans"

    def render(self) -> Text:
        return fans_text(self.fans, self.content_size.width or 76, self.compact)
