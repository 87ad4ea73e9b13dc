"""Joules per device between published snapshots, from the devices' own energy counters.

A device's increment is the increase of its energy channel between two snapshots (``gpu<N>/energy``: NVML
total energy consumption; ``powercap:<zone>/energy``: RAPL ``energy_uj``; both already in J). Kept right
across a device that vanishes (its joules so far stay), a failed read (the next good one covers the gap:
the last good point is carried) and a counter that goes backwards (RAPL wraps at ``max_energy_range_uj``;
NVML's restarts with the driver): that interval is estimated from a rate × the time between the snapshots,
unless that time exceeds ``max_estimate_s`` (a daemon restart, a suspend): then it
counts as unmeasured time rather than a guess. An increase no device can make (more than its ceiling,
:func:`aithermd.backends.energy_rate.device_ceiling_w`, over the gap: a garbage read or a counter re-based
ahead that reached the snapshot) is a bad sample, handled the same way as a counter that went back: the
joules between are estimated, never the garbage counted. The estimate's rate is bounded: never over the
device's ceiling, and for a bad sample the lower of the device's power now and its last measured rate (for
RAPL the power is derived from the same bad read, for a pre-Volta GPU the energy is integrated from it:
attack8 T3). A counter that went back is estimated from the power now (the counter's reset is not the
power channel's), capped at the ceiling. The backends already hold such a reading
``implausible`` (:class:`~aithermd.backends.energy_rate.CounterGuard`); this is the last line, for a point
given back after a restart or a backend without the guard.

Time between snapshots is the boot clock's when the meter has a clock (the energy service's: monotonic, and
counting a suspend, in which the counters go on), else the snapshots' monotonic time: an NTP step of the
wall clock neither stretches nor cuts an interval. Only a point given back after a restart measures its gap
on the wall clock, the only clock that spans the restart.

The points can be saved and given back (:meth:`EnergyMeter.points`, ``seed``) with each device's UUID, the
kernel's boot id and the boot clock, so that after a daemon restart the energy used while it was down is
counted once the counters are read again, as ``Increment.downtime`` (joules no process can be charged:
nobody watched who used them, attack8 T2), its gap measured on the boot clock -- unless the device behind
the id is another one (a renumbered GPU), or the point was saved in another boot (the counters restarted),
whose point is dropped. The first increment after a restart spans no time (``dt_s`` 0): the downtime is no
accounting interval.

A counter that wraps (RAPL ``energy_uj`` at ``max_energy_range_uj``; its reading a
:class:`~aithermd.backends.energy_rate.CounterReading`) is saved with its raw value and where it wraps
(``counter_j``, ``modulus_j``): the backend's total it is compared with after a restart starts again at the
raw counter, so the saved total (wraps included) is no measure. The downtime is the raw counter's increase
modulo the range (one wrap while down counts in full; a run that saw a wrap no longer makes the next
downtime "went back"), and a downtime longer than the counter can represent (the reading's ``max_gap_s``:
the range at the zone's highest power) is unmeasured, with an ``energy_downtime_unmeasured`` log line, never
the remainder (attack13 A2: 300 kJ booked 38 kJ). A point saved without the raw counter (before 2026-12)
stands for it while its total is under one range, else that downtime is unmeasured
(:func:`across_restart`). NVML's total energy (mJ, 64-bit) does not wrap: its points carry no counter and
keep the plain difference.

A point is of this boot when both boot ids are known and equal. With either unknown (``""``: a sandbox
masking ``/proc/sys``, a read error; a point saved without one) it is kept only when the boot clock
*disproves* a reboot: the boot clock has gone on since the point by as much as the wall clock, within
:data:`SAME_BOOT_S` (+ :data:`SAME_BOOT_PPM` of the gap). After a reboot the boot clock restarted at 0, so it
is behind by at least the old boot's uptime at the point; a wall clock stepped meanwhile (NTP) proves nothing
either way, and the point is dropped too: its downtime is unmeasured, never a phantom (attack9 N6: a point of
the previous boot taken against a counter restarted at 0 booked 52 kJ; the restore journal's rule for the
same question is :mod:`aithermd.actuate.boot`'s, which may also put an entry back unsure: a point may not).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from aithermd.backends.energy_rate import MIN_GAP_S, device_ceiling_w
from aithermd.clock import Clock
from aithermd.model import DeviceKind, Quantity, Snapshot, Status, in_total

# s: how far the boot clock's advance since a point may differ from the wall clock's and still disprove a
# reboot (a snapshot's wall time and the boot clock are read a tick apart at most), plus SAME_BOOT_PPM of the
# gap (NTP slews the wall clock by tens of ppm)
SAME_BOOT_S = 5.0
SAME_BOOT_PPM = 1e-4

_log = structlog.get_logger("aithermd.energy")
# a point's tuple: (device, J, power W or None, t_wall, identity, t_run or None, counter J or None,
# modulus J or None)
_Pt = tuple[str, float, float | None, float, str | None, float | None, float | None, float | None]


@dataclass(frozen=True, slots=True)
class Point:
    """One energy counter reading: ``device`` id, ``joules``, ``power_w`` (None if unknown), wall time
    ``t_wall``, the device's ``uuid`` (GPUs) or zone identity, for a restart; for a wrapping counter
    (RAPL) its raw value ``counter_j`` and where it wraps ``modulus_j`` (J)."""

    device: str
    joules: float
    power_w: float | None
    t_wall: float
    identity: str | None = None
    t_run: float | None = None  # this run's boot-clock s; None for a point given back after a restart
    boot: str | None = None  # the kernel's boot id it was read in (None: unknown)
    t_boot: float | None = None  # boot-clock s it was read at (saved: spans a restart within one boot)
    counter_j: float | None = None  # the wrapping raw counter behind ``joules`` (J; RAPL), None: none
    modulus_j: float | None = None  # where that counter wraps (J)


@dataclass(frozen=True, slots=True)
class Increment:
    """What :meth:`EnergyMeter.feed` returns: ``joules`` per device id since the previous snapshot, over
    ``dt_s``; ``unmeasured_s`` per device where the counter went back after too long a gap; ``apart``,
    ``platform`` and ``estimated`` say which devices no total counts (:func:`aithermd.model.in_total`), which
    are the platform (psys) and whose joules are estimated; ``downtime`` the part of ``joules`` per device
    used while the daemon was down (counted in device totals, charged to no process)."""

    dt_s: float
    joules: Mapping[str, float]
    unmeasured_s: Mapping[str, float]
    apart: frozenset[str] = frozenset()  # devices no total counts (a RAPL subzone, psys, an MMIO copy)
    platform: frozenset[str] = frozenset()  # psys: the platform, given apart
    estimated: frozenset[str] = frozenset()  # devices whose joules are integrated from power (pre-Volta)
    downtime: Mapping[str, float] = field(default_factory=dict)  # J of ``joules`` used while it was down


def _identity(dev: Any) -> str | None:
    return dev.info.get("uuid") or dev.info.get("zone") or None


class EnergyMeter:
    """Feed it every published snapshot (:meth:`feed`). ``kinds``: device kinds metered (GPU and powercap by
    default). Per snapshot it costs one reading lookup per energy channel: the devices' layout (energy and
    power channel ids, identity) is worked out again only when the snapshot's device tuple changes, and points
    are plain tuples (a frozen dataclass pays one ``__setattr__`` per field)."""

    def __init__(self, *, kinds: tuple[DeviceKind, ...] = (DeviceKind.GPU, DeviceKind.POWERCAP),
                 max_estimate_s: float = 60.0, seed: Mapping[str, Point] | None = None,
                 clock: Clock | None = None, boot_id: str | None = None) -> None:
        self.kinds = kinds
        self._clock = clock  # its boot clock times the intervals (None: the snapshots' t_mono)
        self.boot_id = boot_id or None  # the kernel's boot id now (None: unknown)
        self.max_estimate_s = max_estimate_s
        # a point of another boot, or of a boot that cannot be told from another, counts nothing now
        seed = {cid: p for cid, p in (seed or {}).items() if self._this_boot(p)}
        self._points: dict[str, _Pt] = {  # channel id → its last good point
            cid: (p.device, p.joules, p.power_w, p.t_wall, p.identity, None, p.counter_j, p.modulus_j)
            for cid, p in (seed or {}).items()}
        # channel id → boot-clock s of a point given back, until its first new reading (downtime)
        self._restored: dict[str, float | None] = {cid: p.t_boot for cid, p in (seed or {}).items()}
        self._rate: dict[str, float] = {}  # channel id → its last measured rate (W)
        self._t_run: float | None = None
        self._devices: Any = None
        # (device, energy ch, power ch, id, ceiling W)
        self._layout: list[tuple[str, str, str | None, str | None, float]] = []
        # (apart, platform, estimated) device ids of the device tuple: see Increment
        self._roles: tuple[frozenset[str], frozenset[str], frozenset[str]] = (frozenset(),) * 3

    def _this_boot(self, p: Point) -> bool:
        """``p`` was read in this boot: the boot ids say so, or with one unknown the boot clock disproves a
        reboot (module doc)."""
        if p.boot and self.boot_id:
            return p.boot == self.boot_id
        if self._clock is None or p.t_boot is None:
            return False
        boot_gap, wall_gap = self._clock.boottime() - p.t_boot, self._clock.wall() - p.t_wall
        return boot_gap >= 0 and abs(boot_gap - wall_gap) <= SAME_BOOT_S + SAME_BOOT_PPM * abs(wall_gap)

    def points(self) -> dict[str, Point]:
        """{channel id: last good point} (for saving across a restart), with the boot id and boot clock."""
        restored, boot_clock = self._restored, self._clock is not None
        return {cid: Point(*p[:6], boot=self.boot_id, t_boot=restored[cid] if cid in restored
                           else p[5] if boot_clock else None, counter_j=p[6], modulus_j=p[7])
                for cid, p in self._points.items()}

    def _plan(self, devices: Any) -> None:
        layout = []
        for dev in devices:
            if dev.kind not in self.kinds:
                continue
            power = next((ch.id for ch in dev.channels if ch.quantity is Quantity.POWER), None)
            for ch in dev.channels:
                if ch.quantity is Quantity.ENERGY:
                    layout.append((dev.id, ch.id, power, _identity(dev), device_ceiling_w(dev)))
        self._devices, self._layout = devices, layout
        self._roles = (frozenset(d.id for d in devices if not in_total(d)),
                       frozenset(d.id for d in devices if d.info.get("role") == "platform"),
                       frozenset(d.id for d in devices
                                 if any(c.estimated for c in d.channels if c.quantity is Quantity.ENERGY)))

    def feed(self, s: Snapshot) -> Increment:
        if s.devices is not self._devices:
            self._plan(s.devices)
        readings, now, ok = s.readings, s.t_wall, Status.OK
        run = s.t_mono if self._clock is None else self._clock.boottime()
        joules: dict[str, float] = {}
        unmeasured: dict[str, float] = {}
        downtime: dict[str, float] = {}
        restored, rates = self._restored, self._rate
        points: dict[str, _Pt] = {}
        before_all = self._points
        for dev_id, cid, power_cid, identity, ceiling in self._layout:
            if dev_id not in joules:
                joules[dev_id] = 0.0
            r = readings.get(cid)
            before = before_all.get(cid)
            if before is not None and before[4] != identity:
                before = None  # another board behind the same id since the point was saved
            value = None if r is None or r.status is not ok else r.value
            if value is None or not math.isfinite(value):
                if before is not None:
                    points[cid] = before  # a failed read loses nothing: the next good one covers it
                continue
            p = readings.get(power_cid) if power_cid is not None else None
            power = p.value if p is not None and p.status is ok else None
            counter = getattr(r, "counter_j", None)  # a wrapping counter (RAPL) behind the total
            modulus = getattr(r, "modulus_j", None) if counter is not None else None
            points[cid] = (dev_id, value, power, now, identity, run, counter, modulus)
            was_down = cid in restored
            t_boot = restored.pop(cid, None) if was_down else None
            if before is None:
                continue  # a new device counts from its next snapshot
            delta = value - before[1]
            # this run: the run clock's gap; a point given back after a restart: the boot clock's where
            # it was saved with it (this boot: checked above), else the wall clock's
            if before[5] is not None:
                gap = run - before[5]
            elif t_boot is not None and self._clock is not None:
                gap = self._clock.boottime() - t_boot
            else:
                gap = now - before[3]
            if was_down and counter is not None and modulus:
                delta, why = across_restart(before, counter, modulus, getattr(r, "max_gap_s", None), gap)
                if delta is None:  # what the counter says now is no measure of the downtime
                    _log.info("energy_downtime_unmeasured", device=dev_id, channel=cid,
                                 gap_s=round(gap, 3), why=why)
                    unmeasured[dev_id] = unmeasured.get(dev_id, 0.0) + max(0.0, gap)
                    continue
            if delta < 0 or delta > ceiling * max(gap, MIN_GAP_S):  # wrapped or reset; or garbage
                if 0 <= gap <= self.max_estimate_s:
                    last = rates.get(cid)
                    if delta < 0:  # went back: the power now is not the counter's
                        rate = power if power is not None else last
                    else:  # a bad sample: the lower of the power now and the last measured rate
                        rate = min((x for x in (power, last) if x is not None), default=None)
                    delta = min(max(rate or 0.0, 0.0), ceiling) * gap
                else:
                    delta = 0.0
                    unmeasured[dev_id] = unmeasured.get(dev_id, 0.0) + max(0.0, gap)
            elif gap > 0:
                rates[cid] = delta / gap
            joules[dev_id] += delta
            if was_down:
                downtime[dev_id] = downtime.get(dev_id, 0.0) + delta
        # the first snapshot spans no accounting time (what came before it is the daemon's downtime)
        dt = 0.0 if self._t_run is None else max(0.0, run - self._t_run)
        self._t_run = run
        self._points = points
        return Increment(dt, joules, unmeasured, *self._roles, downtime=downtime)


def across_restart(before: _Pt, counter: float, modulus: float, max_gap: float | None,
                   gap: float) -> tuple[float | None, str]:
    """J a wrapping counter advanced over a daemon downtime of ``gap`` s, from the saved point ``before`` to
    its raw value now ``counter`` (J): the increase modulo ``modulus`` (J, where it wraps) -- or (None, why)
    where that is no measure: a gap over ``max_gap`` s (the longest the counter can represent: it may have
    wrapped more than once) or over a range at the power of the saved point (a zone drawing over its stated
    highest power), or the clock went back. A point saved without its counter (an energy.json of
    before 2026-12) counts its total as the counter while the total is under one range (that run started it
    at the counter's value and saw no wrap: what the old code assumed, off only where that run discarded an
    interval); over one range that run saw a wrap and the counter's value is unknown: no measure."""
    saved = before[6]
    if saved is None:
        if not 0.0 <= before[1] < modulus:
            return None, "saved without its raw counter by a run that saw it wrap: the counter is unknown"
        saved = before[1]
    elif before[7] != modulus:
        return None, f"the counter's range changed ({before[7]} J then, {modulus} J now)"
    if gap < 0:
        return None, "the clock went back across the restart"
    if max_gap is not None and gap > max_gap:
        return None, (f"down {gap:.0f} s: longer than the counter can represent ({max_gap:.0f} s), it "
                      "may have wrapped more than once")
    if (power := before[2]) is not None and power > 0 and power * gap >= modulus:
        # the zone was drawing more than its stated highest power (PL2, an "unlimited" board)
        return None, (f"down {gap:.0f} s: at the {power:.0f} W it drew when the daemon stopped the counter "
                      f"wraps in {modulus / power:.0f} s, it may have wrapped more than once")
    return (counter - saved) % modulus, ""


def points_to_json(points: Mapping[str, Point]) -> dict[str, Any]:
    return {cid: {"device": p.device, "joules": p.joules, "power_w": p.power_w, "t_wall": p.t_wall,
                  "identity": p.identity, "boot": p.boot, "t_boot": p.t_boot, "counter_j": p.counter_j,
                  "modulus_j": p.modulus_j} for cid, p in points.items()}


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def points_from_json(data: Any) -> dict[str, Point]:
    """The inverse of :func:`points_to_json`; malformed entries are dropped."""
    out: dict[str, Point] = {}
    if not isinstance(data, dict):
        return out
    for cid, d in data.items():
        try:
            t_boot = d.get("t_boot")
            counter, modulus = _finite(d.get("counter_j")), _finite(d.get("modulus_j"))
            if counter is None or modulus is None or modulus <= 0:
                counter = modulus = None
            p = Point(str(d["device"]), float(d["joules"]), None if d.get("power_w") is None
                      else float(d["power_w"]), float(d["t_wall"]), d.get("identity"),
                      boot=None if d.get("boot") is None else str(d["boot"]),
                      t_boot=float(t_boot) if isinstance(t_boot, int | float) and math.isfinite(t_boot)
                      else None, counter_j=counter, modulus_j=modulus)
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(p.joules) and math.isfinite(p.t_wall):
            out[str(cid)] = p
    return out
