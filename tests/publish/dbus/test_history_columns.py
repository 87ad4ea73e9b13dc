"""The history as columns: the same document the ring of snapshots gave, memory bounded in bytes and flat
once allocated, series that come and go, and a budget that shortens the history rather than growing."""

from __future__ import annotations

import math
import random
import tracemalloc
from dataclasses import replace
from types import MappingProxyType

import pytest

from aithermd.model import Channel, Device, DeviceKind, Quantity, Reading, Snapshot, Status
from aithermd.publish.columns import Columns
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot


def snapshot_document(snapshots: list[Snapshot]) -> dict:
    """What GetHistory answered when the hub kept whole snapshots (the oracle)."""
    n = len(snapshots)
    series: dict[str, list] = {}
    knobs: dict[str, list] = {}
    units: dict[str, str] = {}
    knob_units: dict[str, str] = {}
    for i, s in enumerate(snapshots):
        for dev in s.devices:
            for ch in dev.channels:
                units.setdefault(ch.id, ch.unit)
            for k in dev.knobs:
                knob_units.setdefault(k.id, k.unit)
        for cid, r in s.readings.items():
            v = r.value
            series.setdefault(cid, [None] * n)[i] = (v if r.status is Status.OK and v is not None
                                                      and math.isfinite(v) else None)
        for kid, kv in s.knobs.items():
            v = kv.value
            knobs.setdefault(kid, [None] * n)[i] = v if v is not None and math.isfinite(v) else None
    return {"t": [s.t_wall for s in snapshots], "series": series,
            "units": {k: u for k, u in units.items() if k in series}, "knobs": knobs,
            "knob_units": {k: u for k, u in knob_units.items() if k in knobs}}


def noisy(seq: int, rng: random.Random) -> Snapshot:
    """The reference workstation with failed readings, NaN and a GPU that vanishes now and then."""
    s = reference_snapshot(seq)
    readings = dict(s.readings)
    for cid in rng.sample(sorted(readings), 3):
        readings[cid] = Reading(cid, None, Status.FAILED, "EIO")
    cid = rng.choice(sorted(readings))
    readings[cid] = Reading(cid, math.nan)
    if seq % 7 in (3, 4):  # gpu1 lost for two ticks: its series are absent
        readings = {k: v for k, v in readings.items() if not k.startswith("gpu1/")}
    return replace(s, readings=MappingProxyType(readings))


@pytest.mark.parametrize("seconds", [0.0, 3.0, 30.0, 900.0])
def test_columns_give_the_document_the_snapshots_gave(seconds):
    rng = random.Random(5)
    hub = StateHub(history_s=60.0)
    kept: list[Snapshot] = []
    for seq in range(1, 150):
        snap = noisy(seq, rng)
        hub.publish(snap)
        kept.append(snap)
    seconds = min(seconds, hub.history_s)
    horizon = kept[-1].t_mono - seconds
    want = snapshot_document([s for s in kept if s.t_mono >= horizon])
    got = hub.columns.document(seconds)
    assert got["t"] == want["t"]
    assert got["series"] == want["series"]
    assert got["units"] == want["units"]
    assert got["knobs"] == want["knobs"] and got["knob_units"] == want["knob_units"]


def with_gpu_fan(seq: int) -> Snapshot:
    """The reference workstation whose gpu0 has NVML's fan: a speed reading and a duty knob, both
    ``gpu0/fan0`` (the reading is the fan's speed in % of its maximum, the knob the duty asked)."""
    s = reference_snapshot(seq)
    gpu0 = s.devices[0]
    fan = Channel("gpu0/fan0", "gpu0", "fan0", Quantity.UTILIZATION, "%")
    devices = (replace(gpu0, channels=(*gpu0.channels, fan)), *s.devices[1:])
    readings = dict(s.readings, **{"gpu0/fan0": Reading("gpu0/fan0", 55.0 + seq % 3)})
    return replace(s, devices=devices, readings=MappingProxyType(readings))


def test_a_channel_and_a_knob_with_one_id_keep_their_own_series():
    hub = StateHub(history_s=60.0)
    snaps = [with_gpu_fan(seq) for seq in range(1, 6)]
    for snap in snaps:
        hub.publish(snap)
    doc = hub.columns.document(60.0)
    assert doc["series"]["gpu0/fan0"] == [55.0 + seq % 3 for seq in range(1, 6)]  # the fan's speed
    assert doc["knobs"]["gpu0/fan0"] == [40.0 + seq % 10 for seq in range(1, 6)]  # the duty asked
    assert doc["units"]["gpu0/fan0"] == "%" and doc["knob_units"]["gpu0/fan0"] == "%"
    assert doc["knobs"]["gpu0/power_limit"] == [450.0] * 5 and "gpu0/power_limit" not in doc["series"]


def many(n: int, seq: int) -> Snapshot:
    channels = tuple(Channel(f"hwmon:lm75-virtual-0/temp{i}", "hwmon:lm75-virtual-0", f"temp{i}",
                             Quantity.TEMPERATURE, "°C") for i in range(n))
    dev = Device("hwmon:lm75-virtual-0", DeviceKind.HWMON, "lm75", channels)
    return replace(reference_snapshot(seq, gpus=0), devices=(dev,), readings=MappingProxyType(
        {c.id: Reading(c.id, 30.0 + (seq + i) % 7) for i, c in enumerate(channels)}),
        knobs=MappingProxyType({}))


def test_500_series_fit_in_5_mb_and_do_not_grow_once_allocated():
    cols = Columns(history_s=900.0)
    snaps = [many(500, seq) for seq in range(1, 4)]
    cols.append(snaps[0])
    assert cols.rows == 901 and cols.nbytes <= 5_000_000
    for seq in range(2, 1000):  # a whole lap
        cols.append(replace(snaps[seq % 3], t_mono=1000.0 + seq, t_wall=2000.0 + seq))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for seq in range(1000, 1500):
            cols.append(replace(snaps[seq % 3], t_mono=1000.0 + seq, t_wall=2000.0 + seq))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 10_000  # no growth: every row overwrites a preallocated slot
    doc = cols.document(900.0)
    assert len(doc["t"]) == 901 and doc["t"][-1] == 2000.0 + 1499


def test_the_byte_budget_shortens_the_history_instead_of_growing():
    cols = Columns(history_s=900.0, budget_bytes=1_000_000)
    cols.append(many(10, 1))
    assert cols.rows == 901
    for seq in range(2, 50):
        cols.append(many(10, seq))
    cols.append(many(1000, 50))  # a thousand new series: 125 rows fit the budget
    assert cols.nbytes <= 1_000_000 + 8 * 2 * cols.rows
    assert cols.rows == 1_000_000 // (8 * 1000)
    doc = cols.document(900.0)
    assert len(doc["t"]) == 50  # the rows written before the shrink are kept (all 50 fit)
    assert None not in doc["series"]["hwmon:lm75-virtual-0/temp3"]  # a series kept all along
    assert doc["series"]["hwmon:lm75-virtual-0/temp999"] == [None] * 49 + [30.0 + (50 + 999) % 7]


def test_a_vanished_series_is_dropped_after_a_whole_lap():
    cols = Columns(history_s=10.0)
    for seq in range(1, 5):
        cols.append(reference_snapshot(seq, gpus=2))
    for seq in range(5, 30):  # gpu1 gone (a new device list)
        cols.append(reference_snapshot(seq, gpus=1))
    doc = cols.document(10.0)
    assert not [k for k in (*doc["series"], *doc["knobs"]) if k.startswith("gpu1/")]
    assert not [k for k in (*cols._cols, *cols._kcols) if k.startswith("gpu1/")]
