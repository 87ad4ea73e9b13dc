"""AithermApp: the Textual TUI. Workers fetch from the client, messages carry the data, screens render it.

The app takes any object with :class:`~aithermctl.client.DaemonClient`'s async methods (tests inject a
scripted fake). It follows snapshots and events, reconnects with backoff when the daemon or the bus goes
away, and runs the user's changes (override, hold, release, activate, reload) in workers whose failures
come back as one readable line.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from aithermctl.client import describe_owners
from aithermctl.errors import ClientError
from aithermctl.messages import (
    ConnectionChanged,
    EnergyReportArrived,
    EventArrived,
    HistoryArrived,
    PolicyInfoArrived,
    RequestDone,
    SnapshotArrived,
)
from aithermctl.screens.base import DataScreen
from aithermctl.screens.dialogs import HelpScreen, HoldDialog, OverrideDialog
from aithermctl.screens.events import EventsScreen
from aithermctl.screens.overview import OverviewScreen
from aithermctl.screens.plots import PlotsScreen
from aithermctl.screens.policy import PolicyScreen
from aithermctl.screens.processes import ProcessesScreen
from aithermctl.state import TuiState


class AithermApp(App[int]):
    CSS_PATH = "aithermctl.tcss"
    TITLE = "aithermctl"
    ENABLE_COMMAND_PALETTE = False
    MODES = {"overview": OverviewScreen, "plots": PlotsScreen, "policy": PolicyScreen, "events": EventsScreen,
             "processes": ProcessesScreen}
    DEFAULT_MODE = "overview"
    BINDINGS = [
        Binding("1,o", "switch_mode('overview')", "Overview"),
        Binding("2,g", "switch_mode('plots')", "Plots"),
        Binding("3,p", "switch_mode('policy')", "Policy"),
        Binding("4,e", "switch_mode('events')", "Events"),
        Binding("5,j", "switch_mode('processes')", "Processes"),
        Binding("v", "override", "Override"),
        Binding("h", "hold", "Hold"),
        Binding("ctrl+r", "reload", "Reload", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, client: Any, *, history_s: float = 600.0, poll_s: float = 5.0,
                 retry_s: tuple[float, float] = (0.5, 5.0), clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.client = client
        self.state = TuiState(bus=str(getattr(client, "bus", "system")))
        self.state.history.horizon_s = history_s
        self.poll_s, self.retry_s, self.clock = poll_s, retry_s, clock
        self._since_policy_info = 0
        self._owners: dict[str, str | None] = {}  # hold owner (bus name) → "alice: python3 (pid 4242)"

    # workers ------------------------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.run_worker(self._follow_snapshots, group="follow", exclusive=True)
        self.run_worker(self._follow_events, group="events", exclusive=True)

    async def on_unmount(self) -> None:
        await self.client.close()

    async def _follow_snapshots(self) -> None:
        delay = self.retry_s[0]
        while True:
            try:
                await self.client.connect()
                self.post_message(HistoryArrived(await self.client.get_history(self.state.history.horizon_s)))
                async for doc in self.client.snapshots(self.poll_s):
                    if self.state.connected is not True:
                        self.post_message(ConnectionChanged(True))
                    await describe_owners(self.client, (doc.get("policy") or {}).get("holds") or (),
                                          self._owners)
                    self.post_message(SnapshotArrived(doc))
                    delay = self.retry_s[0]
            except ClientError as exc:
                self.post_message(ConnectionChanged(False, str(exc)))
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_s[1])

    async def _follow_events(self) -> None:
        while True:
            try:
                async for kind, event in self.client.events():
                    self.post_message(EventArrived(kind, event))
            except ClientError:
                pass
            await asyncio.sleep(self.retry_s[1])

    def refresh_policy_info(self) -> None:
        """Fetch the policy list and the explanations (the policy screen shows them)."""
        self.run_worker(self._fetch_policy_info, group="policy-info", exclusive=True)

    async def _fetch_policy_info(self) -> None:
        try:
            policies = await self.client.list_policies()
            self.post_message(PolicyInfoArrived(policies, await self.client.explain("")))
        except ClientError:
            pass  # the status line already says what is wrong with the connection

    def refresh_energy_report(self, by: str) -> None:
        """Fetch today's energy report by ``by`` (the processes screen shows it)."""
        self.run_worker(functools.partial(self._fetch_energy_report, by), group="energy-report",
                        exclusive=True)

    async def _fetch_energy_report(self, by: str) -> None:
        since = time.mktime(time.localtime(self.clock())[:3] + (0, 0, 0, 0, 0, -1))  # local midnight
        try:
            report = await self.client.energy_report(since, by)
        except (ClientError, AttributeError):
            return  # an older daemon without GetEnergyReport: the table stays empty
        self.post_message(EnergyReportArrived(report))

    def on_energy_report_arrived(self, message: EnergyReportArrived) -> None:
        self.state.energy_report = message.report
        self._render()

    def submit(self, request: dict[str, Any], origin: Screen | None = None) -> None:
        """Run a change the user asked for; the result comes back as :class:`RequestDone`."""
        self.run_worker(self._do(request, origin), group="request")

    async def _do(self, request: dict[str, Any], origin: Screen | None) -> None:
        c, action = self.client, request["action"]
        try:
            if action == "override":
                _, request["warnings"] = await c.set_override(request["knob"], request["value"],
                                                              request["seconds"])
            elif action == "clear_override":
                await c.clear_override(request["knob"])
            elif action == "hold":
                request["cookie"] = await c.hold_policy(request["policy"], request["reason"],
                                                        request["timeout_s"], request["detached"])
            elif action == "release":
                await c.release_policy(request["cookie"])
            elif action == "set_policy":
                await c.set_active_policy(request["name"])
            elif action == "reload":
                await c.reload()
        except ClientError as exc:
            self.post_message(RequestDone(request, str(exc), origin))
            return
        self.post_message(RequestDone(request, None, origin))

    # messages -----------------------------------------------------------------------------------------
    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.state.doc = message.doc
        t_wall = message.doc.get("t_wall")
        self.state.history.append(float(t_wall) if isinstance(t_wall, int | float) else self.clock(),
                                  message.doc)
        self._since_policy_info += 1
        # a snapshot may arrive while the app shuts down, with no screen left to ask
        if self.screen_stack and isinstance(self.screen, PolicyScreen) and self._since_policy_info >= 5:
            self._since_policy_info = 0
            self.refresh_policy_info()
        self._render()

    def on_history_arrived(self, message: HistoryArrived) -> None:
        self.state.history.load(message.history)
        self._render()

    def on_event_arrived(self, message: EventArrived) -> None:
        self.state.add_event(message.kind, message.event)
        self._render()

    def on_connection_changed(self, message: ConnectionChanged) -> None:
        if message.connected and self.state.connected is False:
            self.state.add_event("connection", {"t_wall": self.clock(), "subject": self.state.bus,
                                                "message": "reconnected to aithermd"})
        elif not message.connected and self.state.connected is not False:
            self.state.add_event("connection", {"t_wall": self.clock(), "subject": self.state.bus,
                                                "message": message.detail})
        self.state.connected, self.state.detail = message.connected, message.detail
        self._render()

    def on_policy_info_arrived(self, message: PolicyInfoArrived) -> None:
        self.state.policies, self.state.explained = message.policies, message.explained
        for screen in self.screen_stack:
            if isinstance(screen, HoldDialog):  # opened before the list was fetched
                screen.set_policies(message.policies)
        self._render()

    def on_request_done(self, message: RequestDone) -> None:
        origin = message.origin
        if origin is not None and origin in self.screen_stack:
            origin.done()
        if message.error:
            if origin is not None and origin in self.screen_stack:
                origin.show_error(message.error)
            else:
                self.notify(message.error, title="refused", severity="error", timeout=10)
            return
        if origin is not None and origin in self.screen_stack:
            origin.dismiss()
        self.notify(_done_text(message.request), timeout=4)
        for warning in message.request.get("warnings") or ():
            self.notify(warning, title="warning", severity="warning", timeout=15)
        self.refresh_policy_info()

    def _render(self) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, DataScreen) and screen.is_mounted:
                screen.show(self.state)

    # actions ------------------------------------------------------------------------------------------
    def action_override(self) -> None:
        self.push_screen(OverrideDialog(self.state.doc))

    def action_hold(self) -> None:
        if not self.state.policies:
            self.refresh_policy_info()
        self.push_screen(HoldDialog(self.state.policies))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_reload(self) -> None:
        self.submit({"action": "reload"})


def _done_text(request: dict[str, Any]) -> str:
    action = request["action"]
    if action == "override":
        until = f" for {request['seconds']:g} s" if request["seconds"] else " until cleared"
        return f"{request['knob']} overridden to {request['value']:g}{until}"
    if action == "clear_override":
        return f"override of {request['knob']} cleared"
    if action == "hold":
        return f"holding {request['policy']} (cookie {request.get('cookie')})"
    if action == "release":
        return f"hold {request['cookie']} released"
    if action == "set_policy":
        return f"active policy is now {request['name']}"
    return "policies reloaded"
