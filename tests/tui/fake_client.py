"""A scripted stand-in for DaemonClient: the TUI's tests drive it from the test (push snapshots and events,
make the daemon vanish and return, refuse calls) and read back what the TUI asked for. Like the real client
it hands out only documents of the daemon's shape (:mod:`aithermd.publish.wire`, strictly: a test cannot
feed the TUI a member the daemon does not send)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aithermctl import errors
from aithermd.publish import wire

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeClient:
    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.bus = "system"
        self.doc = copy.deepcopy(doc) if doc is not None else load("snapshot.json")
        self.history = load("history.json")
        self.policies = load("policies.json")
        self.explained = load("explain.json")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.refuse: dict[str, errors.ClientError] = {}  # method → raised
        self.down = False
        self.connects = 0
        self._snaps: asyncio.Queue[dict[str, Any] | errors.ClientError] = asyncio.Queue()
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    # scripting --------------------------------------------------------------------------------------
    def push(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self._snaps.put_nowait(doc)

    def emit(self, kind: str, event: dict[str, Any]) -> None:
        self._events.put_nowait((kind, event))

    def kill(self) -> None:
        """The daemon leaves the bus: the follower ends with DaemonNotRunning; connects fail until revive."""
        self.down = True
        self._snaps.put_nowait(errors.DaemonNotRunning(self.bus))

    def revive(self) -> None:
        self.down = False

    # the client's interface --------------------------------------------------------------------------
    async def connect(self) -> None:
        self.connects += 1
        if self.down:
            raise errors.DaemonNotRunning(self.bus)

    async def close(self) -> None:
        self.calls.append(("close", ()))

    async def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.down:
            raise errors.DaemonNotRunning(self.bus)
        if name in self.refuse:
            raise self.refuse[name]

    async def get_snapshot(self) -> dict[str, Any]:
        await self._call("get_snapshot")
        return wire.check(self.doc, wire.SnapshotDoc, strict=True)  # only what the daemon could send

    async def get_history(self, seconds: float) -> dict[str, Any]:
        await self._call("get_history", seconds)
        return wire.check(self.history, wire.HistoryDoc, strict=True)

    async def snapshots(self, poll_s: float = 5.0) -> AsyncIterator[dict[str, Any]]:
        await self.connect()
        yield wire.check(self.doc, wire.SnapshotDoc, strict=True)
        while True:
            item = await self._snaps.get()
            if isinstance(item, errors.ClientError):
                raise item
            yield wire.check(item, wire.SnapshotDoc, strict=True)

    async def events(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        while True:
            yield await self._events.get()

    async def energy_report(self, since: float, by: str) -> dict[str, Any]:
        self.calls.append(("energy_report", (since, by)))
        report = getattr(self, "report", None)
        if report is None:
            raise errors.ClientError("no GetEnergyReport on this daemon")
        return {**report, "by": by}

    async def list_policies(self) -> list[dict[str, Any]]:
        await self._call("list_policies")
        return self.policies

    async def explain(self, knob_id: str = "") -> dict[str, Any]:
        await self._call("explain", knob_id)
        return self.explained

    async def set_override(self, knob_id: str, value: float, seconds: float = 0.0) -> tuple[float, list[str]]:
        await self._call("set_override", knob_id, value, seconds)
        return value, []

    async def clear_override(self, knob_id: str) -> None:
        await self._call("clear_override", knob_id)

    async def hold_policy(self, policy: str, reason: str, timeout_s: float = 0.0,
                          detached: bool = False) -> int:
        await self._call("hold_policy", policy, reason, timeout_s, detached)
        return 42

    async def release_policy(self, cookie: int) -> None:
        await self._call("release_policy", cookie)

    async def set_active_policy(self, name: str) -> None:
        await self._call("set_active_policy", name)

    async def reload(self) -> None:
        await self._call("reload")
