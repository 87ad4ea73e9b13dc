"""The overview: a card per GPU, the CPU packages, the board fans."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import Static

from aithermctl.document import overview
from aithermctl.processes import processes_of
from aithermctl.screens.base import DataScreen
from aithermctl.state import TuiState
from aithermctl.widgets.fans import BoardFans
from aithermctl.widgets.gpu_card import GpuCard
from aithermctl.widgets.packages import CpuPackages


class OverviewScreen(DataScreen):
    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="overview-body"):
            yield Static("", id="no-gpu")
            yield Grid(id="gpus")
            yield CpuPackages()
            yield BoardFans()

    def on_resize(self) -> None:
        self.query_one("#gpus").set_class(self.size.width >= 120, "wide")

    def show_body(self, state: TuiState) -> None:
        self.query_one(CpuPackages).display = self.query_one(BoardFans).display = state.doc is not None
        if state.doc is None:
            self.query_one("#no-gpu", Static).update("Waiting for aithermd… (the line above says why)")
            self.query_one("#no-gpu", Static).display = True
            return
        ov = overview(state.doc)
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
            g = gpus.get(view.id)
            card.memory = None if g is None else (g.get("memory_used_bytes"), g.get("memory_total_bytes"))
            card.processes = None if g is None else len(g.get("processes") or ())
        no_gpu = self.query_one("#no-gpu", Static)
        no_gpu.update("" if ov.gpus else "No GPU: the daemon sees no NVIDIA driver on this machine.")
        no_gpu.display = not ov.gpus  # an empty line would push the board fans off a 24-row screen
        self.query_one(CpuPackages).packages = ov.packages
        self.query_one(BoardFans).show(ov.fans)
