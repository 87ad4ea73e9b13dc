"""DataScreen: a screen with the status line on top and the key footer below, drawn from TuiState."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from aithermctl.state import TuiState
from aithermctl.widgets.status_line import StatusLine


class DataScreen(Screen):
    def compose(self) -> ComposeResult:
        yield StatusLine()
        yield from self.compose_body()
        yield Footer(compact=True)

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_screen_resume(self) -> None:
        self.show(self.app.state)  # type: ignore[attr-defined]

    def show(self, state: TuiState) -> None:
        """Render ``state``; called by the app after each message and when the screen comes back.

        A message can arrive while the screen is mounted but its widgets are not (yet, or any more: while it
        composes, or while the app shuts down). Nothing is drawn then; ``on_screen_resume`` draws the screen
        once it is whole."""
        lines = self.query(StatusLine)
        if not lines:
            return
        try:
            self._show(lines.first(), state)
        except NoMatches:  # torn down between the status line and the body
            return

    def _show(self, line: StatusLine, state: TuiState) -> None:
        line.connected, line.detail, line.policy = state.connected, state.detail, state.policy_line()
        # the daemon is gone: the last values stay on screen, dimmed and marked with their time
        stale = state.connected is False and state.doc is not None
        t_wall = (state.doc or {}).get("t_wall")
        line.stale_since = (time.strftime("%H:%M:%S", time.localtime(t_wall))
                            if stale and isinstance(t_wall, int | float) else "stale" if stale else "")
        self.set_class(stale, "stale")
        self.show_body(state)

    def show_body(self, state: TuiState) -> None:
        pass
