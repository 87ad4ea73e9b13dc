"""Health: a derived value's first read warms up (no fault), also for a device that comes back; a stale
read of a device already read is a fault."""

from __future__ import annotations

from aithermd.model import UNITS, Channel, Device, DeviceKind, Quantity, Reading, Status
from aithermd.runtime.health import Health

PKG = "powercap:package-0"
POWER = f"{PKG}/power"
FIRST = Reading(POWER, None, Status.STALE, "first energy read: power needs two")


def _devices() -> tuple[Device, ...]:
    channel = Channel(POWER, PKG, "power", Quantity.POWER, UNITS[Quantity.POWER], "package-0 power")
    return (Device(id=PKG, kind=DeviceKind.POWERCAP, name="package-0", channels=(channel,)),)


def _tick(health: Health, devices: tuple[Device, ...], reading: Reading | None, t: float) -> tuple[set, list]:
    readings = {POWER: reading} if reading is not None else {}
    events: list = []
    readings = health.trust(devices, t, readings)
    return health.check(readings, {}, set(), 1000.0 + t, events), events


def test_a_zone_that_comes_back_warms_up_again_and_a_later_stale_read_is_a_fault():
    health = Health()
    assert _tick(health, _devices(), FIRST, 1.0) == (set(), [])  # the first read of the daemon
    assert _tick(health, _devices()[:1], Reading(POWER, 30.0), 2.0) == (set(), [])
    assert _tick(health, (), None, 3.0) == (set(), [])  # hotplug: the zone is gone
    assert _tick(health, _devices(), FIRST, 4.0) == (set(), [])  # and back: warming up, no fault
    assert _tick(health, _devices(), Reading(POWER, 31.0), 5.0) == (set(), [])
    degraded, events = _tick(health, _devices(), FIRST, 6.0)  # same devices, read already: a fault
    assert degraded == {POWER} and [(e.kind, e.subject) for e in events] == [("fault", POWER)]


def test_the_check_from_the_trusts_verdicts_matches_the_check_of_every_reading():
    """Health.check of the very readings trust() handed back works from the sensor trust's list of readings
    that are not ok; over random runs of every status (held glitches, confirmed failures, stale reads,
    recoveries, missing capabilities) it says what the check of every reading says."""
    import random

    rng = random.Random(7)
    ids = [f"{PKG}/t{i}" for i in range(12)]
    channels = tuple(Channel(c, PKG, c.rsplit("/", 1)[1], Quantity.TEMPERATURE, UNITS[Quantity.TEMPERATURE],
                             c) for c in ids)
    devices = (Device(id=PKG, kind=DeviceKind.HWMON, name="nct", channels=channels),)
    fast, full = Health(), Health()
    bad_seen = 0
    for step in range(400):
        readings = {}
        for c in ids:
            roll = rng.random()
            if roll < 0.75:
                readings[c] = Reading(c, 40.0 + rng.choice((0.0, 0.5, 1.0)))
            elif roll < 0.83:
                readings[c] = Reading(c, None, Status.FAILED, rng.choice(("EIO", "ENODEV", "ETIMEDOUT")))
            elif roll < 0.9:
                readings[c] = Reading(c, None, Status.STALE, "read hung")
            elif roll < 0.95:
                readings[c] = Reading(c, None, Status.IMPLAUSIBLE, "-128 °C")
            elif roll < 0.98:
                readings[c] = Reading(c, None, Status.NOT_SUPPORTED)
        t = float(step)
        a_events: list = []
        b_events: list = []
        a = fast.trust(devices, t, readings)
        a_degraded = fast.check(a, {}, set(), t, a_events)  # the trust's own mapping: its list of suspects
        b = full.trust(devices, t, readings)
        b_degraded = full.check(dict(b), {}, set(), t, b_events)  # a copy: every reading looked at
        assert a == b
        assert a_degraded == b_degraded, step
        assert [(e.subject, e.message) for e in a_events] == [(e.subject, e.message) for e in b_events], step
        assert fast._seen == full._seen, step
        bad_seen += len(a_degraded)
    assert bad_seen > 100  # the run did go through faults
