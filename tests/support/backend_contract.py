"""The contract every backend keeps — the real ones on recorded hardware and the fakes the tests use.

A fake that behaves better than hardware hides bugs (the code passed its tests and failed two thirds of
the real-world reports it was tried against), so the fakes are held to exactly what the real backends
promise (:class:`aithermd.backends.base.Backend`):

- **discovery**: unique device ids; channel and knob ids ``<device id>/<name>``, unique among channels and
  among knobs (a channel may share its id with the knob that drives it: NVML ``gpu0/fan0``); every
  channel's unit is its quantity's (°C, RPM, V, A, W, J, %, MHz); duty knobs in %, limits in W; known
  threshold names with finite values in the channel's unit; ``min ≤ max``; a read-only knob says why;
  ``fan_channel`` names a channel of the same backend;
- **ids are stable**: a second ``discover()``, and another instance over the same hardware, give the same
  ids in the same order (ids never use boot-dependent numbers);
- **sample()** reads every discovered channel and knob, each exactly once: a reading per channel, a knob
  value per knob, nothing else; ``ok`` readings are finite numbers, others carry no value (except ``stale``,
  which may carry the last one) and say why in ``detail``;
- **failures are statuses, never exceptions**: when every read fails, ``sample()`` still returns a reading
  per channel, none of them ``ok``; when the devices vanish, they are listed in ``Sample.lost``, no reading is
  ``ok`` and writes raise :class:`~aithermd.errors.DeviceLost`;
- **knobs**: ``save_knob`` is JSON; a write in range reads back (to the hardware's resolution); a write out
  of range (below min, above max, NaN) raises :class:`~aithermd.errors.OutOfRange` and changes nothing;
  ``restore_knob`` puts back what was saved, value and mode; a read-only knob refuses writes with a
  :class:`~aithermd.errors.BackendError`; an unknown knob id raises :class:`~aithermd.errors.UnknownKnob`
  from every knob method;
- **locator()** is JSON naming the backend; where ``aithermd restore`` can rebuild the backend from it
  (:func:`aithermd.backends.registry.open_backend`) the rebuilt one finds every device and knob;
- **close()** can be called twice.

A :class:`Rig` is one backend on its hardware with the levers the contract pulls; ``tests/backends/
test_contract.py`` builds one per backend and recorded tree, and one per fake.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aithermd.errors import BackendError, DeviceLost, OutOfRange, UnknownKnob
from aithermd.model import UNITS, Device, DeviceKind, KnobKind, Quantity, Sample, Status

THRESHOLDS = {"min", "max", "crit", "lcrit", "emergency", "cap", "slowdown", "shutdown", "max_operating"}
KNOB_UNITS = {KnobKind.PWM: "%", KnobKind.FAN: "%", KnobKind.PL1: "W", KnobKind.PL2: "W",
              KnobKind.POWER_LIMIT: "W", KnobKind.TARGET_TEMPERATURE: "°C", KnobKind.SM_CLOCK_LOCK: "MHz",
              KnobKind.EPP: "", KnobKind.GOVERNOR: "", KnobKind.BOOST: "",
              KnobKind.PLATFORM_PROFILE: ""}  # "": an index into the knob's choices
MODES = {None, "full", "manual", "auto"}
# read-back resolution: pwm is 0–255 (100/255 %), NVML fans whole %, limits µW/mW, locked clocks whole MHz
RESOLUTION = {"%": 100 / 255 + 1e-9, "W": 1e-3 + 1e-9, "MHz": 1.0 + 1e-9}
UNKNOWN = "no-such-device/no-such-knob"
MAX_KNOBS = 4  # knobs exercised per backend: enough to see every kind, few enough to stay fast


@dataclass
class Rig:
    """A backend under test and the levers of its hardware.

    ``make()`` builds a new, undiscovered instance over the same hardware (called once for the backend under
    test, again for the stable-ids check); ``fail_reads()`` makes every read fail from now on (EIO, NVML
    Unknown Error, an OSError from psutil); ``lose()`` makes every device vanish (ENODEV,
    NVML_ERROR_GPU_IS_LOST), None for hardware that cannot vanish; ``before_sample(backend)`` runs before
    each ``sample()`` (the slow lane's reader thread, run in line); ``reopens``: whether
    :func:`aithermd.backends.registry.open_backend` rebuilds it from its locator (the fakes live only in the
    test)."""

    make: Callable[[], Any]
    fail_reads: Callable[[], None] | None
    lose: Callable[[], None] | None
    before_sample: Callable[[Any], None] = lambda backend: None
    reopens: bool = True
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    _made: list[Any] = field(default_factory=list)

    def open(self) -> Any:
        backend = self.make()
        self._made.append(backend)
        return backend

    def sample(self, backend: Any) -> Sample:
        self.before_sample(backend)
        return backend.sample()

    def close(self) -> None:
        for backend in self._made:
            backend.close()
        for fn in self.cleanup:
            fn()


# -- discovery ------------------------------------------------------------------------------------------
def check_devices(devices: list[Device]) -> None:
    """The description of what ``discover()`` found (see the module docstring)."""
    assert isinstance(devices, list), f"discover() returned {type(devices).__name__}, not a list"
    ids = [d.id for d in devices]
    assert len(set(ids)) == len(ids), f"device ids repeat: {ids}"
    channel_ids = {c.id for d in devices for c in d.channels}
    seen: set[str] = set()  # channel ids, then knob ids: two namespaces (an NVML fan is both, gpu0/fan0)
    seen_knobs: set[str] = set()
    for d in devices:
        assert isinstance(d, Device) and d.id and isinstance(d.kind, DeviceKind), d
        assert isinstance(d.name, str) and d.name, f"{d.id}: no name"
        for c in d.channels:
            assert c.id == f"{d.id}/{c.attribute}", f"channel id {c.id} is not {d.id}/{c.attribute}"
            assert c.device_id == d.id and c.id not in seen, f"{c.id}: device or uniqueness"
            seen.add(c.id)
            assert isinstance(c.quantity, Quantity), f"{c.id}: quantity {c.quantity!r}"
            want = UNITS[c.quantity]
            assert c.unit == want, f"{c.id}: unit {c.unit!r} for {c.quantity}, not {want!r}"
            for key, value in c.thresholds.items():
                assert key in THRESHOLDS, f"{c.id}: unknown threshold {key!r}"
                assert _number(value), f"{c.id}: threshold {key} = {value!r}"
        for k in d.knobs:
            assert k.id.startswith(f"{d.id}/") and k.device_id == d.id, f"knob {k.id} outside {d.id}"
            assert k.id not in seen_knobs, f"{k.id} repeats"
            seen_knobs.add(k.id)
            assert k.unit == KNOB_UNITS[k.kind], f"{k.id}: unit {k.unit!r} for a {k.kind} knob"
            for bound in (k.min, k.max, k.default):
                assert bound is None or _number(bound), f"{k.id}: bound {bound!r}"
            if k.min is not None and k.max is not None:
                assert k.min <= k.max, f"{k.id}: min {k.min} > max {k.max}"
            assert k.writable == (k.why_not is None), f"{k.id}: writable={k.writable}, why_not={k.why_not!r}"
            assert k.fan_channel is None or k.fan_channel in channel_ids, f"{k.id}: fan {k.fan_channel}"


def check_stable_ids(rig: Rig) -> None:
    """Ids survive a rediscovery and a restart (another instance over the same hardware)."""
    backend = rig.open()
    first = _ids(backend.discover())
    assert _ids(backend.discover()) == first, "a second discover() changed the ids"
    assert _ids(rig.open().discover()) == first, "another instance over the same hardware found other ids"


# -- sampling -------------------------------------------------------------------------------------------
def check_sample(devices: list[Device], sample: Sample, *, healthy: bool = True) -> None:
    """One reading per discovered channel and one value per knob, nothing else; ``ok`` values are finite
    numbers, the rest say why. ``healthy=False``: no reading may be ``ok``."""
    assert isinstance(sample, Sample), f"sample() returned {type(sample).__name__}"
    assert isinstance(sample.t, float | int) and math.isfinite(sample.t), f"sample time {sample.t!r}"
    channels = [c.id for d in devices for c in d.channels]
    knobs = [k.id for d in devices for k in d.knobs]
    device_ids = {d.id for d in devices}
    assert set(sample.readings) == set(channels), (
        f"readings for {sorted(set(sample.readings) - set(channels))[:5]} that were not discovered, "
        f"none for {sorted(set(channels) - set(sample.readings))[:5]}")
    assert set(sample.knobs) == set(knobs), (
        f"knob values {sorted(set(sample.knobs) ^ set(knobs))[:5]} differ from the discovered knobs")
    assert set(sample.attrs) <= device_ids and sample.lost <= device_ids, "attrs or lost name unknown devices"
    for cid, r in sample.readings.items():
        assert r.channel_id == cid and isinstance(r.status, Status), f"{cid}: {r}"
        if r.status is Status.OK:
            assert healthy, f"{cid}: ok although every read fails ({r.value!r})"
            assert _number(r.value), f"{cid}: ok with value {r.value!r}"
        else:
            assert r.value is None or (r.status is Status.STALE and _number(r.value)), (
                f"{cid}: {r.status} carries {r.value!r}")
            assert isinstance(r.detail, str) and r.detail, f"{cid}: {r.status} without a detail"
    for kid, kv in sample.knobs.items():
        assert kv.knob_id == kid and isinstance(kv.status, Status) and kv.mode in MODES, f"{kid}: {kv}"
        if kv.status is Status.OK:
            assert healthy, f"{kid}: read ok although every read fails"
            assert _number(kv.value), f"{kid}: ok with value {kv.value!r}"
        else:
            assert kv.value is None, f"{kid}: {kv.status} carries {kv.value!r}"


def check_read_failures(rig: Rig) -> None:
    backend = rig.open()
    devices = backend.discover()
    rig.sample(backend)
    assert rig.fail_reads is not None
    rig.fail_reads()
    check_sample(devices, rig.sample(backend), healthy=False)
    for knob in _knobs(devices)[:MAX_KNOBS]:
        kv = backend.read_knob(knob.id)  # a failed read is a status here too, never an exception
        assert kv.knob_id == knob.id and kv.status is not Status.OK and kv.value is None, f"{knob.id}: {kv}"


def check_loss(rig: Rig) -> None:
    backend = rig.open()
    devices = backend.discover()
    rig.sample(backend)
    assert rig.lose is not None
    rig.lose()
    sample = rig.sample(backend)
    check_sample(devices, sample, healthy=False)
    with_channels = {d.id for d in devices if d.channels}
    missing = sorted(with_channels - sample.lost)
    assert not missing, f"vanished devices not reported lost: {missing}"
    for knob in _knobs(devices)[:MAX_KNOBS]:
        if knob.writable:
            try:
                backend.write_knob(knob.id, _in_range(knob, None))
            except DeviceLost:
                continue
            raise AssertionError(f"{knob.id}: a write to a vanished device did not raise DeviceLost")


# -- knobs ----------------------------------------------------------------------------------------------
def check_knobs(rig: Rig) -> None:
    """Save, write in range and read back, refuse out of range unchanged, restore value and mode."""
    backend = rig.open()
    devices = backend.discover()
    writable = [k for k in _knobs(devices) if k.writable][:MAX_KNOBS]
    assert writable, "this rig has no writable knob"
    for knob in writable:
        before = backend.read_knob(knob.id)
        assert before.knob_id == knob.id and before.status is Status.OK, f"{knob.id}: read {before}"
        saved = backend.save_knob(knob.id)
        assert isinstance(saved, dict) and json.loads(json.dumps(saved)) == saved, f"{knob.id}: {saved!r}"
        target = _in_range(knob, before.value)
        backend.write_knob(knob.id, target)
        after = backend.read_knob(knob.id)
        assert after.status is Status.OK and _near(after.value, target, knob.unit), (
            f"{knob.id}: wrote {target} {knob.unit}, read back {after.value}")
        for bad in _out_of_range(knob):
            try:
                backend.write_knob(knob.id, bad)
            except OutOfRange:
                pass
            else:
                raise AssertionError(f"{knob.id}: {bad} {knob.unit} accepted (range {knob.min}–{knob.max})")
            again = backend.read_knob(knob.id)
            assert _near(again.value, after.value, knob.unit), f"{knob.id}: the refused {bad} changed it"
        backend.restore_knob(knob.id, saved)
        restored = backend.read_knob(knob.id)
        assert _near(restored.value, before.value, knob.unit) and restored.mode == before.mode, (
            f"{knob.id}: restored to {restored.value} ({restored.mode}), was {before.value} ({before.mode})")


def check_read_only_knobs(rig: Rig) -> None:
    """A knob discovered read-only refuses a write with a BackendError and keeps its value."""
    backend = rig.open()
    devices = backend.discover()
    read_only = [k for k in _knobs(devices) if not k.writable]
    assert read_only, "this rig has no read-only knob"
    for knob in read_only[:MAX_KNOBS]:
        before = backend.read_knob(knob.id)
        try:
            backend.write_knob(knob.id, _in_range(knob, before.value))
        except BackendError:
            pass
        else:
            raise AssertionError(f"{knob.id} is read-only ({knob.why_not}) but took a write")
        assert _near(backend.read_knob(knob.id).value, before.value, knob.unit), f"{knob.id} changed"


def check_unknown_knob(rig: Rig) -> None:
    backend = rig.open()
    backend.discover()
    calls: dict[str, Callable[[], Any]] = {
        "read_knob": lambda: backend.read_knob(UNKNOWN),
        "write_knob": lambda: backend.write_knob(UNKNOWN, 50.0),
        "save_knob": lambda: backend.save_knob(UNKNOWN),
        "restore_knob": lambda: backend.restore_knob(UNKNOWN, {}),
    }
    for name, call in calls.items():
        try:
            call()
        except UnknownKnob:
            continue
        except Exception as exc:  # noqa: BLE001 - the contract names the class
            raise AssertionError(f"{name}({UNKNOWN!r}) raised {type(exc).__name__}, not UnknownKnob") from exc
        raise AssertionError(f"{name}({UNKNOWN!r}) raised nothing")


# -- lifecycle ------------------------------------------------------------------------------------------
def check_locator(rig: Rig) -> None:
    from aithermd.backends.registry import open_backend

    backend = rig.open()
    devices = backend.discover()
    loc = backend.locator()
    assert isinstance(loc, dict) and json.loads(json.dumps(loc)) == loc, f"locator {loc!r} is not JSON"
    assert isinstance(loc.get("backend"), str) and loc["backend"], f"locator {loc!r} names no backend"
    if not rig.reopens:
        return
    rebuilt = open_backend(loc)
    rig.cleanup.append(rebuilt.close)
    found = rebuilt.discover()
    assert {d.id for d in devices} <= {d.id for d in found}, "the rebuilt backend misses devices"
    assert {k.id for k in _knobs(devices)} <= {k.id for k in _knobs(found)}, "the rebuilt one misses knobs"


def check_close_twice(rig: Rig) -> None:
    backend = rig.open()
    backend.discover()
    rig.sample(backend)
    backend.close()
    backend.close()


# -- helpers --------------------------------------------------------------------------------------------
def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ids(devices: list[Device]) -> list[str]:
    return [i for d in devices for i in (d.id, *(c.id for c in d.channels), *(k.id for k in d.knobs))]


def _knobs(devices: list[Device]) -> list[Any]:
    return [k for d in devices for k in d.knobs]


def _near(a: float | None, b: float | None, unit: str) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= RESOLUTION.get(unit, 1e-6)


def _in_range(knob: Any, current: float | None) -> float:
    """A value inside the knob's constraints that differs from ``current`` where it can (a bound the
    hardware does not state is no constraint: RAPL PL2 with ``max_power_uw`` 0)."""
    if knob.unit == "%":
        lo, hi = knob.min if knob.min is not None else 0.0, knob.max if knob.max is not None else 100.0
        target = 40.0 if lo <= 40.0 <= hi else (lo + hi) / 2
        return 60.0 if current is not None and abs(current - target) < 1 and lo <= 60.0 <= hi else target
    lo = knob.min if knob.min is not None else 1.0
    if knob.max is not None:
        target = float(round((lo + knob.max) / 2))
    elif current is not None:
        target = float(max(round(lo), round(current * 0.9)))
    else:
        target = float(round(lo))
    return target if current is None or abs(current - target) >= 1 else float(round(lo))


def _out_of_range(knob: Any) -> list[float]:
    bad = [math.nan, -1.0]
    if knob.min is not None and knob.min > 0:
        bad.append(knob.min / 2)
    if knob.max is not None:
        bad.append(knob.max + 1.0)
    return bad
