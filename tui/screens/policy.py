"""The policy screen: the active policy and the one in force, loaded policies, holds, each policy's state
machines and the windows that are filling, and why each knob has its value."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from aithermctl.document import effective_policy
from aithermctl.durations import format_duration
from aithermctl.render import hold_ends, owner_text
from aithermctl.screens.base import DataScreen
from aithermctl.state import TuiState
from aithermctl.widgets.gauge import bar


def windows(inputs: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """``(name, elapsed_s, need_s)`` of the inputs that are progress, as the policy engine computes it
    (``{"elapsed_s", "need_s"}``: a window every sample must meet, a dwell, a sustain timer; see
    :mod:`aithermd.policy.conditions`): drawn as they come, nothing recomputed here."""
    out = []
    for name, v in inputs.items():
        if isinstance(v, Mapping) and isinstance(v.get("elapsed_s"), int | float) \
                and isinstance(v.get("need_s"), int | float) and v["need_s"] > 0:
            out.append((name, float(v["elapsed_s"]), float(v["need_s"])))
    return out


def why_text(state: TuiState, width: int) -> Text:
    """Policy states, then one entry per explained knob with its rule, reason and filling windows, for a
    text area ``width`` cells wide."""
    text = Text()
    states = ((state.doc or {}).get("policy") or {}).get("states") or {}
    for policy, scopes in states.items():
        for scope, st in scopes.items():
            text.append(f"{policy} ", style="dim")
            text.append(f"{scope}: ")
            text.append(f"{st}\n", style="bold")
    for knob, entry in state.explained.items():
        rule = entry.get("rule") or entry.get("layer") or "default"
        text.append(f"{knob}", style="bold")
        text.append(f"  {rule}", style="cyan")
        text.append(f"  {entry.get('reason') or ''}\n", style="")
        inputs = entry.get("inputs") or {}
        plain = [f"{k} {_short(v)}" for k, v in inputs.items() if not isinstance(v, Mapping)]
        if plain:
            text.append(f"    {' · '.join(plain)}\n", style="dim")
        for name, elapsed, need in windows(inputs):
            style = "green" if elapsed >= need else "yellow"
            along = f" {format_duration(elapsed)} of {format_duration(need)}"
            text.append(f"    {name} ")
            text.append(bar(elapsed / need, max(6, min(30, width - 5 - len(name) - len(along)))), style=style)
            text.append(f"{along}\n")
    if not text.plain:
        text.append("No state machines and no explanations yet.", style="dim")
    return text


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _short(v: Any) -> str:
    if v is None:
        return "unknown"
    return f"{v:g}" if isinstance(v, float) else str(v)


class PolicyScreen(DataScreen):
    # the tables' titles name these keys: the footer keeps q Quit on 80 columns
    BINDINGS = [Binding("a", "activate", "Activate policy", show=False),
                Binding("r,delete", "release", "Release hold", show=False)]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="policy-body"):
            yield Static("", id="policy-head")
            yield DataTable(id="policies", cursor_type="row")
            yield DataTable(id="holds", cursor_type="row")
            yield Static("", id="why")

    def on_mount(self) -> None:
        policies = self.query_one("#policies", DataTable)
        policies.border_title = "Policies (a: activate)"
        policies.add_columns(" ", "name", "description")
        holds = self.query_one("#holds", DataTable)
        holds.border_title = "Holds (h: new, r: release)"
        holds.add_columns("cookie", "policy", "reason", "owner", "ends")
        self.query_one("#why", Static).border_title = "States, windows and why"

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.app.refresh_policy_info()  # type: ignore[attr-defined]

    def show_body(self, state: TuiState) -> None:
        policy = (state.doc or {}).get("policy") or {}
        head = Text("active ", style="dim")
        head.append(str(policy.get("active") or "—"), style="bold")
        in_force = effective_policy(policy)
        if in_force and in_force != policy.get("active"):
            head.append("   in force ", style="dim")
            head.append(f"{in_force} (held)", style="bold yellow")
        self.query_one("#policy-head", Static).update(head)
        names = max((len(str(p.get("name"))) for p in state.policies), default=4)
        room = max(10, (self.size.width or 80) - names - 16)  # a description longer than the table: cut
        self._fill("#policies", [(("*" if p.get("active") else ""), str(p.get("name")),
                                  _cut(str(p.get("description") or ""), room)) for p in state.policies],
                   [str(p.get("name")) for p in state.policies])
        t_wall = (state.doc or {}).get("t_wall")  # expiries are on the daemon's clock (faster when simulated)
        now = float(t_wall) if isinstance(t_wall, int | float) else time.time()
        holds = policy.get("holds") or ()
        self._fill("#holds", [(str(h.get("cookie")), str(h.get("policy")), Text(str(h.get("reason") or "")),
                               "detached" if h.get("detached") else owner_text(h),
                               hold_ends(h, now))
                              for h in holds], [str(h.get("cookie")) for h in holds])
        why = self.query_one("#why", Static)
        why.update(why_text(state, (self.size.width or 80) - 8))  # its border, padding and scroll bar

    def _fill(self, selector: str, rows: list[tuple[str, ...]], keys: list[str]) -> None:
        table = self.query_one(selector, DataTable)
        if getattr(table, "_shown_rows", None) == rows:
            return
        table._shown_rows = rows  # type: ignore[attr-defined]
        table.clear()
        for row, key in zip(rows, keys, strict=True):
            table.add_row(*row, key=key)

    def _selected(self, selector: str) -> str | None:
        table = self.query_one(selector, DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_activate(self) -> None:
        name = self._selected("#policies")
        if name:
            self.app.submit({"action": "set_policy", "name": name})  # type: ignore[attr-defined]

    def action_release(self) -> None:
        cookie = self._selected("#holds")
        if cookie:
            self.app.submit({"action": "release", "cookie": int(cookie)})  # type: ignore[attr-defined]
