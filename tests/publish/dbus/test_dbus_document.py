"""The GetSnapshot document: the sensors document, extended with thresholds and decisions; JSON-safe whatever
the snapshot holds; always of the shape aithermctl reads (aithermd.publish.wire.SnapshotDoc, strictly)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aithermd.model import Hold, Reading, Status
from aithermd.publish import wire
from aithermd.publish.document import DocumentCache, decision_changes, snapshot_document
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot
from aithermd.publish.sensors import sensors_document

EXTRA_KNOB_KEYS = {"mode", "requested", "reason", "rule", "layer", "label", "fan"}


def test_devices_are_the_sensors_document_plus_thresholds_and_decision_fields():
    snap = reference_snapshot(4)
    ours = snapshot_document(snap)["devices"]
    theirs = json.loads(json.dumps(sensors_document(snap.devices, snap.readings, snap.knobs, snap.attrs)))[
        "devices"]
    for mine, base in zip(ours, theirs, strict=True):
        for key in base.keys() - {"channels", "knobs", "attrs"}:
            assert mine[key] == base[key], key
        for channel, base_channel in zip(mine["channels"], base["channels"], strict=True):
            assert {k: v for k, v in channel.items() if k != "thresholds"} == base_channel
        for knob, base_knob in zip(mine["knobs"], base["knobs"], strict=True):
            assert knob.keys() - base_knob.keys() == EXTRA_KNOB_KEYS
            assert {k: knob[k] for k in base_knob} == base_knob
    assert ours[0]["attrs"] == {"clock_event_reasons": [], "pstate": "P2"}


def test_nan_and_missing_readings_are_null_and_stale():
    snap = reference_snapshot(1)
    readings = dict(snap.readings)
    readings["gpu0/power"] = Reading("gpu0/power", float("nan"), Status.IMPLAUSIBLE, "NaN")
    del readings["gpu0/temperature"]
    text = DocumentCache().text(replace(snap, readings=readings))
    gpu0 = json.loads(text)["devices"][0]
    channels = {c["attribute"]: c for c in gpu0["channels"]}
    assert channels["power"]["value"] is None and channels["power"]["status"] == "implausible"
    assert channels["temperature"]["value"] is None and channels["temperature"]["status"] == "stale"
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON number {c}"))  # NaN only as a reason
    assert channels["power"]["reason"] == "NaN"


def test_the_cache_serialises_once_per_snapshot():
    cache = DocumentCache()
    first = cache.text(reference_snapshot(1))
    assert cache.text(reference_snapshot(1)) is first
    assert json.loads(cache.text(reference_snapshot(2)))["seq"] == 2


def test_decision_changes():
    one, two = reference_snapshot(1), reference_snapshot(2)
    assert len(decision_changes(None, one)) == len(one.decisions)
    assert decision_changes(one, one) == []
    assert {d.knob_id for d in decision_changes(one, two)} == {"gpu0/fan0", "gpu1/fan0"}  # fan values move


def test_thresholds_are_published_where_the_source_states_them():
    devices = {d["id"]: d for d in snapshot_document(reference_snapshot(1))["devices"]}
    gpu = {c["attribute"]: c for c in devices["gpu0"]["channels"]}
    assert gpu["temperature"]["thresholds"] == {"slowdown": 87.0, "shutdown": 92.0}  # NVML
    assert "thresholds" not in gpu["power"]  # none stated: no member
    nct = {c["attribute"]: c for c in devices["hwmon:nct6798-isa-0290"]["channels"]}
    assert nct["temp1"]["thresholds"] == {"max": 80.0}  # hwmon tempN_max
    assert "thresholds" not in nct["fan1"]


def test_every_document_has_the_typed_shape_aithermctl_reads():
    hold = Hold(17, "quiet", "meeting", ":1.42", uid=1000, created=1_767_225_000.0, expires=1_767_229_000.0)
    snapshots = [reference_snapshot(seq, holds=(hold,) if seq % 2 else ()) for seq in range(1, 30)]
    for snap in snapshots:
        wire.check(json.loads(DocumentCache().text(snap)), wire.SnapshotDoc, strict=True)
    wire.check(json.loads(DocumentCache().text(None)), wire.SnapshotDoc, strict=True)
    hub = StateHub()
    for snap in snapshots:
        hub.publish(snap)
    wire.check(json.loads(json.dumps(hub.columns.document(900))), wire.HistoryDoc, strict=True)
    wire.check(json.loads(json.dumps(StateHub().columns.document(900))), wire.HistoryDoc, strict=True)


def test_the_schema_check_names_what_is_wrong_and_where():
    doc = json.loads(DocumentCache().text(reference_snapshot(1)))
    cases = [
        (lambda d: d.pop("devices"), "document: missing devices"),
        (lambda d: d["devices"][0]["channels"][0].update(value="71"), "channels[0].value: expected float"),
        (lambda d: d["devices"][0]["channels"][0].update(status="fine"), "'fine' is not one of"),
        (lambda d: d["devices"][0]["knobs"][0].update(writable=None), "writable: null where a bool is"),
        (lambda d: d.update(seq=True), "seq: expected int, got bool"),
        (lambda d: d["devices"][0]["channels"][0].update(value=float("nan")), "expected float"),
        (lambda d: d["policy"]["holds"].append({"cookie": 1}), "policy.holds[0]: missing"),
    ]
    for spoil, message in cases:
        bad = json.loads(json.dumps(doc))
        spoil(bad)
        try:
            wire.check(bad, wire.SnapshotDoc, strict=False)
        except wire.DocumentError as exc:
            assert message in str(exc), (message, str(exc))
        else:
            raise AssertionError(f"accepted: {message}")


def test_a_member_the_schema_does_not_name_fails_strictly_and_passes_a_newer_daemons_reader():
    doc = json.loads(DocumentCache().text(reference_snapshot(1)))
    doc["devices"][0]["serial"] = "1324021012345"  # a member no schema names
    assert wire.snapshot_doc(doc) is doc  # aithermctl reading a newer daemon
    try:
        wire.check(doc, wire.SnapshotDoc, strict=True)
    except wire.DocumentError as exc:
        assert str(exc) == "devices[0]: unknown member serial"
    else:
        raise AssertionError("an undeclared member passed the strict check")


def test_the_schemas_names_are_the_models():
    """wire.py is dependency-free, so it spells the model's enums out: they must not drift apart."""
    from typing import get_args

    from aithermd.model import DeviceKind, KnobKind, Layer
    from aithermd.publish.sensors import HELD_STATUS

    # the document's statuses: the model's, and "held" (an ok reading the sensor trust carried over)
    assert set(get_args(wire.StatusName)) == {str(s) for s in Status} | {HELD_STATUS}
    assert set(get_args(wire.DeviceKindName)) == {str(k) for k in DeviceKind}
    assert set(get_args(wire.KnobKindName)) == {str(k) for k in KnobKind}
    assert set(get_args(wire.LayerName)) == {str(layer) for layer in Layer}
