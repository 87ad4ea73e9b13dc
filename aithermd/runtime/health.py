"""Health: what each reading is worth, which channels, knobs and devices are degraded this tick, and one
fault event per fault.

Each reading is first judged against its channel's history (:meth:`Health.trust`, the sensor trust of
:mod:`aithermd.backends.trust`): a transient fault or a spike is held at the last good value for one
reading within 3 s, a persistent or confirmed one passes through, so the failsafe follows a confirmed
failure within 2 readings and 3 s and never a single glitch.

A reading that is failed, implausible or stale, a knob whose read-back is, and a device the backend
reports lost are *degraded* (published in the snapshot; the engine's safety layer drives the fans that
read a degraded temperature to full). A fault is reported once, when it appears or changes status, and
logged as ``recovered`` when it goes away; a derived value's first read (RAPL power needs two energy
reads) is warming up, not a fault, also when its device is added or comes back after the start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from aithermd.backends.trust import SensorTrust
from aithermd.model import Device, Event, KnobValue, Reading, Status

BAD = frozenset({Status.FAILED, Status.IMPLAUSIBLE, Status.STALE})
_OK = Status.OK

_log = structlog.get_logger("aithermd.health")


def fault(t_wall: float, subject: str, message: str, **data: Any) -> Event:
    """A ``fault`` event about ``subject`` (logged as an error)."""
    _log.error("fault", subject=subject, message=message, **data)
    return Event("fault", t_wall, subject, message, data)


class Health:
    """What went bad since the last tick. One per daemon run (it remembers what it reported)."""

    def __init__(self) -> None:
        self._bad: dict[str, Status] = {}
        self._seen: set[str] = set()  # channels read at least once
        self._lost: set[str] = set()
        self._trust = SensorTrust()
        self._devices: tuple[Device, ...] | None = None
        self._trusted: Mapping[str, Reading] | None = None  # what trust() handed back last

    def trust(self, devices: tuple[Device, ...], t_mono: float,
              readings: Mapping[str, Reading]) -> Mapping[str, Reading]:
        """The readings the engine should see at ``t_mono`` (s), judged by the sensor trust (rate limits
        set up again when the device set changes)."""
        if devices is not self._devices:
            self._trust.configure(devices)
            known = {d.id for d in self._devices or ()}
            for device in devices:  # a device added or back (hotplug): its first read warms up again
                if device.id not in known:
                    self._seen.difference_update(c.id for c in device.channels)
            self._devices = devices
        self._trusted = trusted = self._trust.filter(t_mono, readings)
        return trusted

    def _judge(self, cid: str, r: Reading, degraded: set[str], t_wall: float, events: list[Event]) -> None:
        """One reading: seen when it is good (or a derived value's first stale read), else degraded and its
        fault reported once per status."""
        status = r.status
        if status is _OK or status not in BAD:
            self._seen.add(cid)
            return
        if status is Status.STALE and cid not in self._seen:
            self._seen.add(cid)  # a derived value's first read (RAPL power needs two energy reads): no fault
            return
        degraded.add(cid)
        if self._bad.get(cid) != status:
            self._bad[cid] = status
            events.append(fault(t_wall, cid, f"{cid} {status}: {r.detail or 'no value'}",
                                status=str(status), detail=r.detail))

    def check(self, readings: Mapping[str, Reading], knobs: Mapping[str, KnobValue], lost: set[str],
              t_wall: float, events: list[Event]) -> set[str]:
        """The degraded channel, knob and device ids of this tick; new faults appended to ``events``."""
        degraded: set[str] = set(lost)
        seen = self._seen
        if readings is self._trusted:  # the sensor trust's verdicts: it listed those not ok
            self._trusted = None  # once: the list is of that very call
            suspects = self._trust.not_ok
            for cid in suspects:
                self._judge(cid, readings[cid], degraded, t_wall, events)
            # every other reading is ok: seen, in one pass in C
            seen.update(readings.keys() - suspects if suspects else readings)
        else:
            for cid, r in readings.items():
                self._judge(cid, r, degraded, t_wall, events)
        for cid in [c for c in self._bad if c not in degraded]:
            del self._bad[cid]
            _log.info("recovered", subject=cid)
        for kid, kv in knobs.items():
            if kv.status in BAD:
                degraded.add(kid)
        for device_id in lost - self._lost:
            events.append(fault(t_wall, device_id, f"{device_id} lost: skipped until it comes back"))
        for device_id in self._lost - lost:
            _log.info("recovered", subject=device_id)
        self._lost = set(lost)
        return degraded
