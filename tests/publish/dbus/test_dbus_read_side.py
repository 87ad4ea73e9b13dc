"""Anyone may read: properties, GetSnapshot, GetHistory, Explain, ListPolicies, GetPolicy, signals."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from dbus_fast import Message, MessageType, Variant
from dbus_helpers import call, ok

from aithermd.model import Event, Hold, Layer, PolicyStatus
from aithermd.publish import wire
from aithermd.publish.reference import reference_snapshot


def _collect(bus, member: str, interface: str = wire.INTERFACE) -> list[Message]:
    """Signals ``member`` from anyone on ``interface`` land in the returned list."""
    seen: list[Message] = []

    def handler(msg: Message) -> None:
        if msg.message_type is MessageType.SIGNAL and msg.member == member and msg.interface == interface:
            seen.append(msg)

    bus.add_message_handler(handler)
    return seen


async def _subscribe(bus, rule: str) -> None:
    reply = await call(bus, "AddMatch", "s", [rule], destination="org.freedesktop.DBus",
                       path="/org/freedesktop/DBus", interface="org.freedesktop.DBus")
    assert reply.message_type is MessageType.METHOD_RETURN


async def test_get_snapshot_is_the_sensors_document_with_decisions_and_policy(service, client):
    (text,) = await ok(client, "GetSnapshot")
    doc = json.loads(text)
    assert doc["seq"] == 1
    gpu0 = next(d for d in doc["devices"] if d["id"] == "gpu0")
    assert gpu0["kind"] == "gpu" and "chip" not in gpu0
    limit = next(k for k in gpu0["knobs"] if k["id"] == "gpu0/power_limit")
    assert limit["value"] == 450.0 and limit["min"] == 150.0 and limit["max"] == 600.0
    assert limit["requested"] == 450.0 and limit["reason"] == "power_limit follows balanced"
    temp = next(c for c in gpu0["channels"] if c["attribute"] == "temperature")
    assert temp["unit"] == "°C" and temp["status"] == "ok" and isinstance(temp["value"], float)
    sio = next(d for d in doc["devices"] if d["id"] == "hwmon:nct6798-isa-0290")
    assert sio["chip"] == "nct6798-isa-0290"
    assert [c["label"] for c in sio["channels"]][:3] == ["fan1", "CPU fan", "fan3"]
    assert doc["policy"] == {"active": "balanced", "holds": [], "states": {"balanced": {"gpu0": "idle"}}}


async def test_get_snapshot_follows_the_latest_publish(service, client, hub):
    hub.publish(reference_snapshot(7))
    (text,) = await ok(client, "GetSnapshot")
    assert json.loads(text)["seq"] == 7


async def test_properties_read_and_change_with_the_snapshot(service, client, hub):
    (props,) = await ok_props(client)
    assert props["Version"].value and props["ActivePolicy"].value == "balanced"
    assert json.loads(props["Holds"].value) == [] and props["DegradedDevices"].value == []
    assert props["DryRun"].value is False
    await _subscribe(client, "type='signal',interface='org.freedesktop.DBus.Properties'")
    changes = _collect(client, "PropertiesChanged", "org.freedesktop.DBus.Properties")
    hold = Hold(cookie=3, policy="quiet", reason="meeting", owner=":1.9", uid=1000, expires=None)
    snap = reference_snapshot(2, active="ai-training", holds=(hold,))
    hub.publish(replace(snap, degraded=("gpu1",)))
    await ok(client, "GetSnapshot")  # a round trip: signals sent before the reply have arrived
    assert len(changes) == 1
    _iface, changed, _invalid = changes[0].body
    assert changed["ActivePolicy"].value == "ai-training"
    assert changed["DegradedDevices"].value == ["gpu1"]
    assert json.loads(changed["Holds"].value)[0]["cookie"] == 3
    assert json.loads(changed["PolicyStates"].value) == {"ai-training": {"gpu0": "idle"}}
    assert "Version" not in changed and "DryRun" not in changed
    hub.publish(replace(reference_snapshot(3, active="ai-training", holds=(hold,)), degraded=("gpu1",)))
    await ok(client, "GetSnapshot")
    assert len(changes) == 1  # nothing changed: no signal


async def ok_props(client):
    reply = await call(client, "GetAll", "s", [wire.INTERFACE], interface="org.freedesktop.DBus.Properties")
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body
    return reply.body


async def test_get_history_returns_the_window_as_columns(service, client, hub):
    for seq in range(2, 6):
        hub.publish(reference_snapshot(seq))
    (text,) = await ok(client, "GetHistory", "d", [3.0])
    doc = json.loads(text)
    assert doc["t"] == [reference_snapshot(s).t_wall for s in (2, 3, 4, 5)]
    assert doc["series"]["gpu0/energy"] == [1200.0, 1300.0, 1400.0, 1500.0]
    assert "gpu0/power_limit" not in doc["series"]  # a knob: its read-back values are apart
    assert doc["knobs"]["gpu0/power_limit"] == [450.0] * 4
    assert doc["units"]["gpu0/energy"] == "J" and doc["knob_units"]["gpu0/power_limit"] == "W"
    reply = await call(client, "GetHistory", "d", [-1.0])
    assert reply.error_name == wire.ERROR_INVALID_ARGUMENT


async def test_explain_and_policies_come_from_the_control(service, client):
    (text,) = await ok(client, "Explain", "s", ["gpu0/power_limit"])
    assert json.loads(text)["gpu0/power_limit"]["rule"] == "balanced/x"
    (text,) = await ok(client, "Explain", "s", [""])
    assert len(json.loads(text)) == 9  # 2 GPUs × (power limit, fan) + 3 pwm + PL1, PL2
    assert (await call(client, "Explain", "s", ["gpu9/nope"])).error_name == wire.ERROR_UNKNOWN_KNOB
    (text,) = await ok(client, "ListPolicies")
    assert [(p["name"], p["active"]) for p in json.loads(text)] == [
        ("ai-training", False), ("balanced", True), ("quiet", False)]
    (text,) = await ok(client, "GetPolicy", "s", ["quiet"])
    assert json.loads(text)["source"] == "name: quiet\n"
    assert (await call(client, "GetPolicy", "s", ["nope"])).error_name == wire.ERROR_UNKNOWN_POLICY


async def test_events_and_decisions_become_event_signals(service, client, hub):
    await _subscribe(client, f"type='signal',interface='{wire.INTERFACE}'")
    events = _collect(client, "Event")
    drift = Event("drift", 1.0, "hwmon:nct6798-isa-0290/pwm2", "pwm2 read back 40 % after writing 60 %",
                  {"knob": "hwmon:nct6798-isa-0290/pwm2"})
    snap = reference_snapshot(2)
    decisions = dict(snap.decisions)
    decisions["gpu0/power_limit"] = replace(decisions["gpu0/power_limit"], value=350.0, rule="safety/hot",
                                            layer=Layer.SAFETY, reason="gpu0 at 90 °C")
    hub.publish(replace(snap, decisions=decisions), [drift])
    await ok(client, "GetSnapshot")
    kinds = [(m.body[0], json.loads(m.body[1])["subject"]) for m in events]
    assert ("drift", "hwmon:nct6798-isa-0290/pwm2") in kinds
    decided = [json.loads(m.body[1]) for m in events if m.body[0] == "decision"]
    # seq 1 → 2: the fan0 values changed (40 + seq % 10) and gpu0/power_limit changed rule
    assert {d["subject"] for d in decided} == {"gpu0/power_limit", "gpu0/fan0", "gpu1/fan0"}
    limit = next(d for d in decided if d["subject"] == "gpu0/power_limit")
    assert limit["data"] == {"value": 350.0, "requested": 450.0, "rule": "safety/hot", "layer": "safety"}


async def test_snapshot_updated_is_rate_limited_but_the_last_one_arrives(bus_address, polkitd, control, hub,
                                                                          client):
    from aithermd.publish import dbus_service

    handle = await dbus_service.start(bus_address, control, hub, snapshot_interval_s=0.2)
    try:
        await _subscribe(client, f"type='signal',interface='{wire.INTERFACE}',member='SnapshotUpdated'")
        updates = _collect(client, "SnapshotUpdated")
        for seq in range(2, 12):
            hub.publish(reference_snapshot(seq))
        await ok(client, "GetSnapshot")
        assert [m.body[0] for m in updates] == [2]
        for _ in range(100):  # the trailing signal carries the latest seq
            if len(updates) > 1:
                break
            await asyncio.sleep(0.05)
        assert [m.body[0] for m in updates] == [2, 11]
    finally:
        await handle.stop()


async def test_dry_run_property(bus_address, polkitd, control, hub, client):
    from aithermd.publish import dbus_service

    handle = await dbus_service.start(bus_address, control, hub, dry_run=True)
    try:
        reply = await call(client, "Get", "ss", [wire.INTERFACE, "DryRun"],
                           interface="org.freedesktop.DBus.Properties")
        assert reply.body[0] == Variant("b", True)
    finally:
        await handle.stop()


async def test_before_the_first_tick_the_snapshot_is_empty(bus_address, polkitd, control, client):
    from aithermd.publish import dbus_service
    from aithermd.publish.hub import StateHub

    handle = await dbus_service.start(bus_address, control, StateHub())
    try:
        (text,) = await ok(client, "GetSnapshot")
        doc = wire.check(json.loads(text), wire.SnapshotDoc, strict=True)
        assert doc == {"seq": 0, "t_wall": None, "tick_s": None, "dry_run": False, "degraded": [],
                       "devices": [], "policy": {"active": "", "holds": [], "states": {}}}
        assert PolicyStatus().active == ""
    finally:
        await handle.stop()


async def test_a_long_history_is_built_off_the_loop_and_shared(service, client, hub):
    for seq in range(2, 301):
        hub.publish(reference_snapshot(seq))
    replies = await asyncio.gather(*(ok(client, "GetHistory", "d", [900.0]) for _ in range(5)))
    docs = [json.loads(text) for (text,) in replies]
    assert all(d == docs[0] for d in docs)
    assert len(docs[0]["t"]) == 300 and docs[0]["series"]["gpu1/energy"][-1] == 1000.0 + 100.0 * 300


async def test_get_snapshot_before_the_first_tick_waits_for_it(bus_address, polkitd, control, client):
    """D-Bus activation: the name is owned before the first tick, and the call that started the daemon is
    the first to read. It gets the first tick's snapshot, not an empty document."""
    from aithermd.publish import dbus_service
    from aithermd.publish.hub import StateHub

    hub = StateHub()
    handle = await dbus_service.start(bus_address, control, hub, snapshot_interval_s=0.0)
    try:
        reply = asyncio.ensure_future(ok(client, "GetSnapshot"))
        await asyncio.sleep(0.3)
        assert not reply.done()  # no snapshot yet: the reader waits
        hub.publish(reference_snapshot(1))
        (text,) = await asyncio.wait_for(reply, 10)
        doc = json.loads(text)
        assert doc["seq"] == 1 and any(d["id"] == "gpu0" for d in doc["devices"])
    finally:
        await handle.stop()
