"""A scripted stand-in for aithermd on a private bus: the interface of ``aithermd.publish.wire`` served with
dbus-fast from the JSON fixtures in ``tests/tui/fixtures``. It lets the client and the CLI be tested over a
real ``dbus-daemon`` before (and independently of) the real daemon; tests against the simulated daemon live
in ``test_cli_simulated.py``.

Run as a process: ``python tests/tui/fake_daemon.py ADDRESS`` (prints ``ready`` when it owns the name).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from aithermd.model import Hold
from aithermd.publish import wire
from aithermd.publish.document import hold_document

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeDaemon:
    """``deny``: method names answered with NotAuthorized; ``reload_error``: text of a PolicyInvalid."""

    def __init__(self) -> None:
        self.children_at_stop: list[str] | None = None  # states of a pid: scope's children at its stop
        self.doc = load("snapshot.json")
        self.doc["policy"]["holds"] = []
        self.history = load("history.json")
        self.explained = load("explain.json")
        self.policies = load("policies.json")
        self.calls: list[tuple[str, list[Any], str]] = []
        self.deny: set[str] = set()
        self.reload_error: str | None = None
        self.overrides: dict[str, tuple[float, float]] = {}
        self.released: list[str] = []
        self.windows: dict[int, tuple[str, float]] = {}
        self.progress: list[tuple[list[str], float]] = []  # ReportProgress calls: (gpus, rate)
        self.bus: MessageBus | None = None
        self._next = 100

    # lifecycle
    async def start(self, address: str) -> FakeDaemon:
        self.bus = await MessageBus(bus_address=address).connect()
        self.bus.add_message_handler(self._handle)
        await self.bus.call(Message(
            destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member="AddMatch", signature="s",
            body=["type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged'"]))
        await self.bus.request_name(wire.BUS_NAME)
        return self

    def stop(self) -> None:
        if self.bus is not None:
            self.bus.disconnect()
            self.bus = None

    @property
    def holds(self) -> list[dict[str, Any]]:
        return self.doc["policy"]["holds"]

    async def emit(self, member: str, signature: str, body: list[Any]) -> None:
        assert self.bus is not None
        await self.bus.send(Message.new_signal(wire.OBJECT_PATH, wire.INTERFACE, member, signature, body))

    async def publish(self, doc: dict[str, Any] | None = None) -> None:
        """Replace the snapshot (keeping the holds) and emit SnapshotUpdated."""
        if doc is not None:
            holds = self.holds
            self.doc = copy.deepcopy(doc)
            self.doc.setdefault("policy", {})["holds"] = holds
        self.doc["seq"] = self.doc.get("seq", 0) + 1
        await self.emit("SnapshotUpdated", "t", [self.doc["seq"]])

    # dispatch
    def _handle(self, msg: Message) -> Message | bool | None:
        if msg.message_type is MessageType.SIGNAL and msg.member == "NameOwnerChanged":
            name, _old, new = msg.body
            if not new:  # a caller left the bus: its non-detached holds end (power-profiles-daemon style)
                self.doc["policy"]["holds"] = [h for h in self.holds if h["detached"] or h["owner"] != name]
            return None
        if msg.message_type is not MessageType.METHOD_CALL or msg.path != wire.OBJECT_PATH:
            return None
        if msg.interface == "org.freedesktop.DBus.Properties" and msg.member == "Get":
            return Message.new_method_return(msg, "v", [self._property(msg.body[1])])
        if msg.interface != wire.INTERFACE or msg.member not in wire.METHODS:
            return None
        self.calls.append((msg.member, list(msg.body), msg.sender))
        if msg.member in self.deny:
            return Message.new_error(msg, wire.ERROR_NOT_AUTHORIZED,
                                     f"polkit denied {msg.member} for this caller")
        try:
            result = getattr(self, "m_" + msg.member)(msg, *msg.body)
        except _Err as err:
            return Message.new_error(msg, err.name, err.text)
        out_sig = wire.METHODS[msg.member][1]
        body = result if len(out_sig) > 1 and not out_sig.startswith(("a", "(")) else [result]  # several outs
        return Message.new_method_return(msg, out_sig, body if out_sig else [])

    def _property(self, name: str) -> Variant:
        values = {"Version": "0.1.0-fake", "ActivePolicy": self.doc["policy"]["active"],
                  "Holds": json.dumps(self.holds), "PolicyStates": json.dumps(self.doc["policy"]["states"]),
                  "DegradedDevices": list(self.doc.get("degraded", [])), "DryRun": False}
        return Variant(wire.PROPERTIES[name], values[name])

    def _knob(self, knob_id: str) -> dict[str, Any]:
        for device in self.doc["devices"]:
            for knob in device["knobs"]:
                if knob["id"] == knob_id:
                    return knob
        raise _Err(wire.ERROR_UNKNOWN_KNOB, f"no knob {knob_id!r}")

    def _policy(self, name: str) -> None:
        if name not in {p["name"] for p in self.policies}:
            raise _Err(wire.ERROR_UNKNOWN_POLICY, f"no policy {name!r}")

    # methods
    def m_GetSnapshot(self, msg: Message) -> str:  # only what the real daemon could send
        return json.dumps(wire.check(self.doc, wire.SnapshotDoc, strict=True), ensure_ascii=False)

    def m_GetHistory(self, msg: Message, seconds: float) -> str:
        return json.dumps(wire.check(self.history, wire.HistoryDoc, strict=True))

    def m_Explain(self, msg: Message, knob_id: str) -> str:
        if knob_id:
            self._knob(knob_id)
            return json.dumps({knob_id: self.explained.get(knob_id, {"value": None, "layer": "default"})})
        return json.dumps(self.explained, ensure_ascii=False)

    def m_ListPolicies(self, msg: Message) -> str:
        return json.dumps([dict(p, active=p["name"] == self.doc["policy"]["active"]) for p in self.policies])

    def m_GetPolicy(self, msg: Message, name: str) -> str:
        self._policy(name)
        source = load("policy_quiet.json")
        return json.dumps(dict(source, name=name))

    def m_SetActivePolicy(self, msg: Message, name: str) -> None:
        self._policy(name)
        self.doc["policy"]["active"] = name

    def m_HoldPolicy(self, msg: Message, policy: str, reason: str, timeout_s: float, detached: bool) -> int:
        self._policy(policy)
        self._next += 1
        now = time.time()
        self.holds.append(hold_document(Hold(self._next, policy, reason, msg.sender, uid=0, created=now,
                                             expires=now + timeout_s if timeout_s else None,
                                             detached=detached)))
        return self._next

    def m_ReleasePolicy(self, msg: Message, cookie: int) -> None:
        if cookie not in {h["cookie"] for h in self.holds}:
            raise _Err(wire.ERROR_UNKNOWN_COOKIE, f"no hold with cookie {cookie}")
        self.doc["policy"]["holds"] = [h for h in self.holds if h["cookie"] != cookie]

    def m_SetOverride(self, msg: Message, knob_id: str, value: float, seconds: float) -> float:
        knob = self._knob(knob_id)
        margin = max(0.1 * (knob["max"] - knob["min"]), 1.0)  # as the daemon: just outside is clamped
        if not knob["min"] - margin <= value <= knob["max"] + margin:
            raise _Err(wire.ERROR_OUT_OF_RANGE,
                       f"{knob_id}: {value:g} {knob['unit']} is outside {knob['min']:g}–{knob['max']:g}")
        applied = min(max(value, knob["min"]), knob["max"])
        self.overrides[knob_id] = (applied, seconds)
        return [applied, []]

    def m_ReleaseGpu(self, msg: Message, device_id: str) -> str:
        if not any(d["id"] == device_id and d["kind"] == "gpu" for d in self.doc["devices"]):
            raise _Err(wire.ERROR_UNKNOWN_KNOB, f"no GPU {device_id!r}")
        self.released.append(device_id)
        return f"{device_id} (PCI ?) released: originals restored, no longer used until it is back"

    def m_ClearOverride(self, msg: Message, knob_id: str) -> None:
        self._knob(knob_id)
        self.overrides.pop(knob_id, None)

    def m_ReportProgress(self, msg: Message, gpus: list[str], rate: float) -> None:
        known = {d["id"] for d in self.doc["devices"] if d.get("kind") == "gpu"}
        if not gpus or set(gpus) - known:
            raise _Err(wire.ERROR_INVALID_ARGUMENT, f"no GPU {', '.join(sorted(set(gpus) - known))} here")
        self.progress.append((list(gpus), rate))

    def m_Reload(self, msg: Message) -> None:
        if self.reload_error:
            raise _Err(wire.ERROR_POLICY_INVALID, self.reload_error)

    def m_StartEnergyWindow(self, msg: Message, name: str, timeout_s: float) -> int:
        return self.m_StartScopedEnergyWindow(msg, name, timeout_s, "")

    def m_StartScopedEnergyWindow(self, msg: Message, name: str, timeout_s: float, scope: str) -> int:
        self._next += 1
        self.windows[self._next] = (name, time.monotonic(), scope)
        return self._next

    def m_StopEnergyWindow(self, msg: Message, window: int) -> str:
        return self.m_StopEnergyWindowNamed(msg, window, "")

    def m_StopEnergyWindowNamed(self, msg: Message, window: int, expected: str) -> str:
        if window not in self.windows:
            raise _Err(wire.ERROR_UNKNOWN_WINDOW, f"no energy window {window}")
        name, start, scope = self.windows.pop(window)
        duration = time.monotonic() - start
        if scope.startswith("pid:"):  # the states of the scope's children now (Z: exited, not yet reaped)
            self.children_at_stop = _children_states(int(scope[4:]))
        # the daemon's own window document (fixtures/energy.json), its joules scaled to this window's length
        doc = load("energy.json")
        joules = {k: j * duration / doc["duration_s"] for k, j in doc["joules"].items()}
        doc.update(id=window, name=name, started=time.time() - duration, duration_s=duration, joules=joules,
                   total_j=sum(joules.values()))
        if scope:  # its own share: the whole of gpu0 and a tenth of the CPU package, as the accounting says
            attributed = {"cpu": joules["powercap:package-0"] / 10, "gpu0": joules["gpu0"]}
            doc.update(scope=scope, attributed=attributed, attributed_total_j=sum(attributed.values()))
        return json.dumps(doc)


def _children_states(ppid: int) -> list[str]:
    """The state letters (proc(5) ``stat`` field 3) of ``ppid``'s children."""
    states = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == ppid:
                states.append(fields[0])
    return states


class _Err(Exception):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name, self.text = name, text


async def _serve(address: str) -> None:
    daemon = await FakeDaemon().start(address)
    print("ready", flush=True)
    assert daemon.bus is not None
    await daemon.bus.wait_for_disconnect()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1]))
