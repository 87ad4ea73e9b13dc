"""The events log: decisions, drift, faults, hotplug, as the daemon's Event signal brings them."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from aithermctl.screens.base import DataScreen
from aithermctl.state import TuiState

STYLES = {"fault": "bold red", "drift": "yellow", "hotplug": "cyan", "decision": "green",
          "connection": "magenta"}


def event_row(kind: str, event: dict[str, Any]) -> tuple[str, str, str, str]:
    t = event.get("t_wall")
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "--:--:--"
    return stamp, kind, str(event.get("subject") or ""), str(event.get("message") or event)


LIMIT_KNOBS = ("/power_limit", "/pl1", "/pl2")  # GPU power limits, RAPL PL1/PL2


def is_limit_event(event: dict[str, Any]) -> bool:
    """Whether ``event`` is about a power limit (its subject is a GPU power limit or a RAPL PL1/PL2)."""
    return str(event.get("subject") or "").endswith(LIMIT_KNOBS)


class EventsScreen(DataScreen):
    BINDINGS = [Binding("f", "filter", "Filter", show=False)]  # the title names it: the footer keeps q Quit

    def __init__(self) -> None:
        super().__init__()
        self._shown = 0  # state.events_total at the last render
        self._kind = "all"

    def compose_body(self) -> ComposeResult:
        yield DataTable(id="events", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("time", "kind", "subject", "message")
        self._title()

    def _title(self) -> None:
        self.query_one(DataTable).border_title = f"Events ({self._kind}; f: filter)"

    def action_filter(self) -> None:
        """Cycle through all, limits (power limits only: no fan decision floods them), then each kind seen
        so far (in order of first appearance)."""
        state: TuiState = self.app.state  # type: ignore[attr-defined]
        kinds = ["all", "limits", *dict.fromkeys(kind for kind, _ in state.events)]
        self._kind = kinds[(kinds.index(self._kind) + 1) % len(kinds)] if self._kind in kinds else "all"
        self._title()
        self.query_one(DataTable).clear()
        self._shown = 0
        self.show(self.app.state)  # type: ignore[attr-defined]

    def show_body(self, state: TuiState) -> None:
        new = min(state.events_total - self._shown, len(state.events))
        if new <= 0:
            return
        table = self.query_one(DataTable)
        at_end = table.cursor_row >= table.row_count - 1
        for kind, event in list(state.events)[-new:]:
            if self._kind in ("all", kind) or (self._kind == "limits" and is_limit_event(event)):
                stamp, k, subject, message = event_row(kind, event)
                table.add_row(stamp, Text(k, style=STYLES.get(kind, "")), Text(subject), Text(message))
        self._shown = state.events_total
        if at_end and table.row_count:
            table.move_cursor(row=table.row_count - 1)
