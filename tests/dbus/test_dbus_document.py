"""The GetSnapshot document: the sensors document, extended; JSON-safe whatever the snapshot holds."""

from __future__ import annotations

import json
from dataclasses import replace

from aithermd.model import Reading, Status
from aithermd.publish.document import DocumentCache, decision_changes, snapshot_document
from aithermd.publish.reference import reference_snapshot
from aithermd.publish.sensors import sensors_document

EXTRA_KNOB_KEYS = {"mode", "requested", "reason", "rule", "layer"}


def test_devices_are_the_sensors_document_plus_decision_fields():
    snap = reference_snapshot(4)
    ours = snapshot_document(snap)["devices"]
    theirs = json.loads(json.dumps(sensors_document(snap.devices, snap.readings, snap.knobs, snap.attrs)))[
        "devices"]
    for mine, base in zip(ours, theirs, strict=True):
        for key in base.keys() - {"knobs", "attrs"}:
            assert mine[key] == base[key], key
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
    assert "NaN" not in text


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
