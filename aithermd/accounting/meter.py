"""Joules per device between published snapshots, from the devices' own energy counters.

A device's increment is the increase of its energy channel between two snapshots (``gpu<N>/energy``: NVML
total energy consumption; ``powercap:<zone>/energy``: RAPL ``energy_uj``; both already in J). Kept right
across a device that vanishes (its joules so far stay), a failed read (the next good one covers the gap:
the last good point is carried) and a counter that goes backwards (RAPL wraps at ``max_energy_range_uj``;
NVML's restarts with the driver): that interval is estimated from the device's power channel × the time
between the snapshots, unless that time exceeds ``max_estimate_s`` (a daemon restart, a suspend): then it
counts as unmeasured time rather than a guess.

The points can be saved and given back (:meth:`EnergyMeter.points`, ``seed``) with each device's UUID, so
that after a daemon restart the energy used while it was down is counted once the counters are read again
-- unless the device behind the id is another one (a renumbered GPU), whose point is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.model import DeviceKind, Quantity, Snapshot, Status


@dataclass(frozen=True, slots=True)
class Point:
    """One energy counter reading: ``device`` id, ``joules``, ``power_w`` (None if unknown), wall time
    ``t_wall``, the device's ``uuid`` (GPUs) or zone identity, for a restart."""

    device: str
    joules: float
    power_w: float | None
    t_wall: float
    identity: str | None = None


@dataclass(frozen=True, slots=True)
class Increment:
    """What :meth:`EnergyMeter.feed` returns: ``joules`` per device id since the previous snapshot, over
    ``dt_s``; ``unmeasured_s`` per device where the counter went back after too long a gap."""

    dt_s: float
    joules: Mapping[str, float]
    unmeasured_s: Mapping[str, float]


def _identity(dev: Any) -> str | None:
    return dev.info.get("uuid") or dev.info.get("zone") or None


class EnergyMeter:
    """Feed it every published snapshot (:meth:`feed`). ``kinds``: device kinds metered (GPU and powercap by
    default)."""

    def __init__(self, *, kinds: tuple[DeviceKind, ...] = (DeviceKind.GPU, DeviceKind.POWERCAP),
                 max_estimate_s: float = 60.0, seed: Mapping[str, Point] | None = None) -> None:
        self.kinds = kinds
        self.max_estimate_s = max_estimate_s
        self._points: dict[str, Point] = dict(seed or {})
        self._t_wall: float | None = max((p.t_wall for p in self._points.values()), default=None)

    def points(self) -> dict[str, Point]:
        """{channel id: last good point} (for saving across a restart)."""
        return dict(self._points)

    def feed(self, s: Snapshot) -> Increment:
        joules: dict[str, float] = {}
        unmeasured: dict[str, float] = {}
        points: dict[str, Point] = {}
        for dev in s.devices:
            if dev.kind not in self.kinds:
                continue
            power = None
            for ch in dev.channels:
                r = s.readings.get(ch.id)
                if ch.quantity is Quantity.POWER and r is not None and r.status is Status.OK:
                    power = r.value
            identity = _identity(dev)
            for ch in dev.channels:
                if ch.quantity is not Quantity.ENERGY:
                    continue
                joules.setdefault(dev.id, 0.0)
                r = s.readings.get(ch.id)
                before = self._points.get(ch.id)
                if before is not None and before.identity != identity:
                    before = None  # another board behind the same id since the point was saved
                if r is None or r.status is not Status.OK or r.value is None or not math.isfinite(r.value):
                    if before is not None:
                        points[ch.id] = before  # a failed read loses nothing: the next good one covers it
                    continue
                points[ch.id] = Point(dev.id, r.value, power, s.t_wall, identity)
                if before is None:
                    continue  # a new device counts from its next snapshot
                delta = r.value - before.joules
                gap = max(0.0, s.t_wall - before.t_wall)
                if delta < 0:  # wrapped or reset
                    if gap <= self.max_estimate_s:
                        delta = (power or 0.0) * gap
                    else:
                        delta = 0.0
                        unmeasured[dev.id] = unmeasured.get(dev.id, 0.0) + gap
                joules[dev.id] += delta
        dt = 0.0 if self._t_wall is None else max(0.0, s.t_wall - self._t_wall)
        self._t_wall = s.t_wall
        self._points = points
        return Increment(dt, joules, unmeasured)


def points_to_json(points: Mapping[str, Point]) -> dict[str, Any]:
    return {cid: {"device": p.device, "joules": p.joules, "power_w": p.power_w, "t_wall": p.t_wall,
                  "identity": p.identity} for cid, p in points.items()}


def points_from_json(data: Any) -> dict[str, Point]:
    """The inverse of :func:`points_to_json`; malformed entries are dropped."""
    out: dict[str, Point] = {}
    if not isinstance(data, dict):
        return out
    for cid, d in data.items():
        try:
            p = Point(str(d["device"]), float(d["joules"]), None if d.get("power_w") is None
                      else float(d["power_w"]), float(d["t_wall"]), d.get("identity"))
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(p.joules) and math.isfinite(p.t_wall):
            out[str(cid)] = p
    return out
