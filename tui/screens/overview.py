"""The overview: a card per GPU, the CPU packages, the board fans, and power plots below them.

It fits the screen: where the full cards and the fan table would not fit (two GPUs at 80×24), the cards
take two gauges a line and the fans several a line, so every fan stays on screen; where room is left over
(140×40), each GPU's and CPU package's power against its limit is plotted in it.
"""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import Static

from aithermctl.document import Overview, overview
from aithermctl.processes import processes_of
from aithermctl.screens.base import DataScreen
from aithermctl.screens.plots import plot_specs, show_plots
from aithermctl.state import TuiState
from aithermctl.widgets.fans import BoardFans, compact_layout
from aithermctl.widgets.gpu_card import GpuCard
from aithermctl.widgets.packages import CpuPackages

WIDE_COLS = 120  # GPU cards two a row from here
CARD_ROWS, COMPACT_CARD_ROWS = 7, 5  # a GPU card with its border (full: 5 lines; compact: 3)
TREND_MIN_ROWS = 8  # the power plots need this much room left over


def rows_needed(ov: Overview, wide: bool, compact: bool, width: int) -> int:
    """Screen rows the overview takes (status line and footer included) without the power plots."""
    per_row = 2 if wide else 1
    cards = math.ceil(len(ov.gpus) / per_row) * (COMPACT_CARD_ROWS if compact else CARD_ROWS) or 1
    packages = 2 + max(1, len(ov.packages))
    if compact and ov.fans:
        entries, widths = compact_layout(ov.fans, width - 4)  # the panel's border and padding
        fans = 2 + math.ceil(len(entries) / len(widths))
    else:
        fans = 3 + len(ov.fans)
    return 2 + cards + packages + max(3, fans)


class OverviewScreen(DataScreen):
    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="overview-body"):
            yield Static("", id="no-gpu")
            yield Grid(id="gpus")
            yield CpuPackages()
            yield BoardFans()
            yield Grid(id="trends")

    def on_resize(self) -> None:
        self.query_one("#gpus").set_class(self.size.width >= WIDE_COLS, "wide")
        self.show(self.app.state)  # type: ignore[attr-defined]

    def show_body(self, state: TuiState) -> None:
        fans, trends = self.query_one(BoardFans), self.query_one("#trends", Grid)
        self.query_one(CpuPackages).display = fans.display = state.doc is not None
        if state.doc is None:
            self.query_one("#no-gpu", Static).update("Waiting for aithermd… (the line above says why)")
            self.query_one("#no-gpu", Static).display = True
            trends.display = False
            return
        ov = overview(state.doc)
        width, height = self.size.width or 80, self.size.height or 24
        wide = width >= WIDE_COLS
        compact = rows_needed(ov, wide, False, width) > height
        grid = self.query_one("#gpus", Grid)
        cards = list(grid.query(GpuCard))
        for card in cards[len(ov.gpus):]:
            card.remove()
        if len(cards) < len(ov.gpus):
            new = [GpuCard(id=f"card-{g.id}") for g in ov.gpus[len(cards):]]
            grid.mount_all(new)
            cards += new
        gpus = (processes_of(state.doc) or {}).get("gpus") or {}
        for card, view in zip(cards, ov.gpus, strict=False):
            card.view = view
            card.compact = compact
            g = gpus.get(view.id)
            card.memory = None if g is None else (g.get("memory_used_bytes"), g.get("memory_total_bytes"))
            card.processes = None if g is None else len(g.get("processes") or ())
        no_gpu = self.query_one("#no-gpu", Static)
        no_gpu.update("" if ov.gpus else "No GPU: the daemon sees no NVIDIA driver on this machine.")
        no_gpu.display = not ov.gpus  # an empty line would push the board fans off a 24-row screen
        self.query_one(CpuPackages).packages = ov.packages
        fans.compact = compact
        fans.show(ov.fans)
        plots = plot_specs(state, kinds=("power", "cpu"))
        room = height - rows_needed(ov, wide, compact, width)
        trends.display = bool(plots) and room >= TREND_MIN_ROWS
        if trends.display:
            trends.styles.grid_size_columns = min(len(plots), 4 if wide else 2)
            trends.styles.height = room
            show_plots(trends, plots, state)
