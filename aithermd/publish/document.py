"""The ``GetSnapshot`` JSON document: ``aithermd sensors --json`` plus thresholds, decisions and policy state.

The shape is :class:`aithermd.publish.wire.SnapshotDoc` (typed there for aithermctl too)::

    {"seq": int, "t_wall": s, "tick_s": s, "dry_run": bool, "degraded": [id...],
     "devices": [{"id", "kind", "name", "chip" (hwmon only), "info" (GPUs: "index", "uuid", "pci_bus_id"),
                  "channels": [{"id", "attribute", "label", "value", "unit", "status",
                                "thresholds" (only when the source states any)}],
                  "knobs": [{"id", "kind", "value", "unit", "min", "max", "default", "writable", "why_not",
                             "mode", "requested", "reason", "rule", "layer", "label",
                             "fan": null | {"tachs", "start_pct", "stop_pct", "max_rpm": {tach: RPM},
                                            "levels", "calibrated"}}],
                  "attrs": {...}}],
     "policy": {"active": str, "holds": [{"cookie", "policy", "reason", "owner", "detached", "expires",
                                         "uid", "created"}],
                "states": {policy: {scope: state}}},
     "health": {"nvml": {"library", "error", "reinits", "expected", "present", "gpus": {...}}, ...},
     "alarms": {id: {"kind", "message", "since"}},
     "budget": {"policy", "budget_w", "how", "wall_w", "allotted_w", "drawn_w", "wall_drawn_w",
                "devices": {id: {"allotted_w", "drawn_w", ...}}}   (only while a power budget is in force)}

RAPL devices also carry ``role`` (``package``, ``platform``, ``core``...) and, when no total counts them,
``"in_total": false`` (and ``duplicate_of`` for an MMIO copy of a package).

``label`` falls back to the attribute name, as lm-sensors prints it; a knob's ``label`` is the admin's name
(null without one) and ``fan`` what fan detection and calibration found for a pwm (null: paired by
number, uncalibrated); ``levels`` is the number of levels its driver keeps (0: every one). Values are in
daemon units (°C, W, J, RPM, %); ``thresholds`` are the channel's own (hwmon ``crit``/``max``/..., NVML
``slowdown``/``shutdown``/``max_operating``) in its unit; knob ``requested``/``reason`` come from this
tick's winning decision (null when no decision touched the knob); ``alarms`` are what needs a person
(:class:`aithermd.model.Alarm`), by knob or fan channel id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from aithermd.model import (
    Alarm,
    Decision,
    Device,
    DeviceKind,
    Event,
    FanCalibration,
    Hold,
    KnobValue,
    PolicyStatus,
    Reading,
    Snapshot,
    in_total,
)
from aithermd.publish.sensors import sensors_document
from aithermd.publish.wire import AlarmDoc, DeviceDoc, FanDoc, HoldDoc, PolicyDoc, SnapshotDoc


INFO = ("index", "uuid", "pci_bus_id")  # a GPU's identity (DeviceInfoDoc): what CUDA_VISIBLE_DEVICES names


def _num(value: float | None) -> float | None:
    """JSON has no NaN/inf: they become null."""
    if value is None or not math.isfinite(value):
        return None
    return value


def plain(value: Any) -> Any:
    """Mappings, tuples, sets and enums made JSON-ready."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list, frozenset, set)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return _num(value)
    return value


def sensors_devices(devices: tuple[Device, ...], readings: Mapping[str, Reading],
                    knobs: Mapping[str, KnobValue],
                    attrs: Mapping[str, Mapping[str, Any]]) -> list[DeviceDoc]:
    """The ``devices`` list of the ``aithermd sensors --json`` document (:func:`aithermd.publish.sensors.
    sensors_document`), each channel with its ``thresholds`` (when it has any), each knob with its
    read-back ``mode`` and device ``attrs`` made JSON-ready (the ``decision`` members are added by
    :func:`snapshot_document`)."""
    out = sensors_document(devices, readings, knobs, attrs)["devices"]
    for device, dev in zip(devices, out, strict=True):
        for channel, entry in zip(device.channels, dev["channels"], strict=True):
            if channel.thresholds:  # finite by the backend contract; JSON-safe whatever a backend sends
                entry["thresholds"] = {k: v for k, v in channel.thresholds.items() if math.isfinite(v)}
        for knob in dev["knobs"]:
            kv = knobs.get(knob["id"])
            knob["mode"] = kv.mode if kv is not None else None
        if "attrs" in dev:
            dev["attrs"] = plain(dev["attrs"])
        info = {k: device.info[k] for k in INFO if device.info.get(k) is not None}
        if info:
            dev["info"] = info  # type: ignore[typeddict-item]
    return out


def hold_document(hold: Hold) -> HoldDoc:
    """One hold as in the ``Holds`` property: ``expires`` is wall-clock seconds or null."""
    return {"cookie": hold.cookie, "policy": hold.policy, "reason": hold.reason, "owner": hold.owner,
            "detached": hold.detached, "expires": hold.expires, "uid": hold.uid, "created": hold.created}


def policy_document(status: PolicyStatus) -> PolicyDoc:
    return {"active": status.active, "holds": [hold_document(h) for h in status.holds],
            "states": plain(status.states)}


def fan_document(cal: FanCalibration | None) -> FanDoc | None:
    """A pwm's detection and calibration for the document (see the module docstring)."""
    if cal is None:
        return None
    return {"tachs": list(cal.tachs), "start_pct": cal.start_pct, "stop_pct": cal.stop_pct,
            "max_rpm": {t: max(r for _, r in pts) for t, pts in cal.rpm.items() if pts},
            "levels": len(cal.levels), "calibrated": cal.calibrated}


def alarm_document(alarm: Alarm) -> AlarmDoc:
    return {"kind": alarm.kind, "message": alarm.message, "since": alarm.since}


def snapshot_document(snapshot: Snapshot) -> SnapshotDoc:
    """The full ``GetSnapshot`` document of one published snapshot (see the module docstring)."""
    devices = sensors_devices(snapshot.devices, snapshot.readings, snapshot.knobs, snapshot.attrs)
    for dev, device in zip(devices, snapshot.devices, strict=True):
        if device.kind is DeviceKind.POWERCAP:
            dev["role"] = device.info.get("role")
            if not in_total(device):
                dev["in_total"] = False
            if device.info.get("duplicate_of"):
                dev["duplicate_of"] = device.info["duplicate_of"]
    described = {k.id: k for d in snapshot.devices for k in d.knobs}
    for dev in devices:
        for knob in dev["knobs"]:
            d = snapshot.decisions.get(knob["id"])
            knob["requested"] = _num(d.requested if d.requested is not None else d.value) if d else None
            knob["reason"] = d.reason if d else None
            knob["rule"] = d.rule if d else None
            knob["layer"] = str(d.layer) if d else None
            k = described.get(knob["id"])
            knob["label"] = k.label if k is not None else None
            knob["fan"] = fan_document(k.fan if k is not None else None)
    doc: SnapshotDoc = {
        "seq": snapshot.seq, "t_wall": snapshot.t_wall, "tick_s": snapshot.tick_s,
        "dry_run": snapshot.dry_run, "degraded": list(snapshot.degraded), "devices": devices, "policy": policy_document(snapshot.policy),
        "health": plain(snapshot.health),
        "alarms": {k: alarm_document(a) for k, a in sorted(snapshot.alarms.items())}}
    if snapshot.budget:
        doc["budget"] = plain(snapshot.budget)
    return doc


def decision_changes(previous: Snapshot | None, current: Snapshot) -> list[Decision]:
    """This tick's winning decisions whose rule, layer or value differ from the previous snapshot's (all of
    them on the first snapshot): the "decisions" of D-Bus ``Event`` and ``aithermd_decisions_total``."""
    before = previous.decisions if previous is not None else {}
    if before is current.decisions:  # the engine's very mapping of the last tick: nothing changed
        return []
    changed = []
    for knob_id, d in current.decisions.items():
        p = before.get(knob_id)
        if p is d:
            continue
        if p is None or p.rule != d.rule or p.layer != d.layer or p.value != d.value:
            changed.append(d)
    return changed


def event_document(e: Event) -> dict[str, Any]:
    """One D-Bus ``Event`` signal's JSON body: ``{"kind", "t_wall" (s), "subject", "message", "data"}``."""
    return {"kind": e.kind, "t_wall": e.t_wall, "subject": e.subject, "message": e.message,
            "data": plain(e.data)}


def event_signals(previous: Snapshot | None, current: Snapshot,
                  events: Sequence[Event]) -> list[tuple[str, dict[str, Any]]]:
    """The ``Event(kind, json)`` signals of one published snapshot, in order: each hub event, then each
    changed decision (:func:`decision_changes`) as kind ``decision`` with ``data`` ``{"value",
    "requested", "rule", "layer"}`` (the knob's unit: W, %)."""
    out = [(e.kind, event_document(e)) for e in events]
    for d in decision_changes(previous, current):
        out.append(("decision", event_document(Event(
            "decision", current.t_wall, d.knob_id, d.reason,
            {"value": d.value, "requested": d.requested, "rule": d.rule, "layer": str(d.layer)}))))
    return out


# before the first tick: no time yet, nothing found, no policy loaded
EMPTY_DOCUMENT: SnapshotDoc = {"seq": 0, "t_wall": None, "tick_s": None, "dry_run": False, "degraded": [],
                               "devices": [], "policy": {"active": "", "holds": [], "states": {}}}


def with_processes(text: str, processes: str | None) -> str:
    """The ``GetSnapshot`` text: the snapshot document ``text`` with the ``GetProcesses`` document
    ``processes`` (JSON, as of the accounting's last pass) under ``"processes"``; ``text`` alone where the
    daemon accounts no energy (``processes`` None)."""
    if processes is None or not text.endswith("}"):
        return text
    return f'{text[:-1]},"processes":{processes}}}'


class DocumentCache:
    """The JSON text of the latest snapshot's document, built once per snapshot (``GetSnapshot`` is called
    by many clients per tick; serialising once keeps the event loop free)."""

    def __init__(self) -> None:
        self._key: tuple[int, float] | None = None
        self._text = ""

    def text(self, snapshot: Snapshot | None) -> str:
        if snapshot is None:
            return json.dumps(EMPTY_DOCUMENT)
        key = (snapshot.seq, snapshot.t_mono)
        if key != self._key:
            self._text = json.dumps(snapshot_document(snapshot), separators=(",", ":"))
            self._key = key
        return self._text
