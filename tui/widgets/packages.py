"""CpuPackages: each RAPL package's power against PL1/PL2, and its temperature."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from aithermctl.document import CpuPackageView, fmt
from aithermctl.widgets.gauge import gauge, ratio


def packages_text(packages: tuple[CpuPackageView, ...], width: int) -> Text:
    text = Text()
    bar_w = max(4, min(30, width - 50))
    for i, p in enumerate(packages):
        if i:
            text.append("\n")
        text.append(f"{p.name:<10} {fmt(p.power_w, 'W', 1):>8} ")
        text.append_text(gauge(ratio(p.power_w, p.pl1_w), bar_w, 0.9, 1.0))
        text.append(f" PL1 {fmt(p.pl1_w, 'W')}  PL2 {fmt(p.pl2_w, 'W')}  {fmt(p.temp_c, '°C')}")
        if p.rule:
            text.append(f"  {p.rule}", style="cyan")
    if not packages:
        text.append("no RAPL package zone", style="dim")
    return text


class CpuPackages(Widget):
    DEFAULT_CSS = "CpuPackages { height: auto; border: round $secondary; padding: 0 1; }"
    packages: reactive[tuple[CpuPackageView, ...]] = reactive((), layout=True)

    def on_mount(self) -> None:
        self.border_title = "CPU packages"

    def render(self) -> Text:
        return packages_text(self.packages, self.content_size.width or 78)
