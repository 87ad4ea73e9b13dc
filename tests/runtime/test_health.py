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
