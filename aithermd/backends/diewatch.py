"""A GPU die's temperature judged by its own draw: too cold for the power it takes, or stuck while the power
moved (attack5 C1). Pure; :class:`aithermd.backends.trust.SensorTrust` asks it once per tick.

A temperature frozen at any plausible value (a driver returning its last cached value, a hung SMBus or
out-of-band read path, a dead thermal diode reporting a constant) passed every range check: the safety
layer released a GPU's critical cut on it and raised its power limit from 208 W to 598 W under a die past
its trip point. Two physical checks on a device's ``temperature`` beside its ``power``
(:mod:`aithermd.backends.plausible`, with their sources):

- **draw floor**: a die drawing P W is at least ``DIE_K_PER_W × P`` over its air, which is above 0 °C: a
  reading under ``DIE_FLOOR_C + DIE_K_PER_W × P`` is *implausible* (3 °C at 208 W). As any implausible value,
  held once, then a confirmed failure;
- **stuck**: a reading that stayed bit-identical while the mean draw over ``STUCK_SETTLE_S`` took two values
  ``STUCK_SWING_W`` apart (the die alone moves ≥ 3 °C), or its mean over ``STUCK_SLOW_S`` two values
  ``STUCK_SLOW_SWING_W`` apart (die and heatsink move ≥ 2.1 °C), every span of draws inside the unchanged
  reading, is *implausible* until it changes. A healthy idle card (flat reading, flat draw) is never judged;
  neither is a reading within ``FIRMWARE_BAND_C`` of the channel's lowest own threshold (firmware holding
  the die at its thermal target by moving its power).

Either way the reading reaches the safety layer as implausible: the GPU's fans go to full and a latched cut
holds (a release ramp goes back to its cut), never on a single reading. Cost: per GPU and tick a few dict
lookups and two deques of draws (the last 5 s and 60 s of ticks).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aithermd.backends.plausible import (
    DIE_FLOOR_C,
    DIE_K_PER_W,
    FIRMWARE_BAND_C,
    STUCK_SETTLE_S,
    STUCK_SLOW_S,
    STUCK_SLOW_SWING_W,
    STUCK_SWING_W,
)
from aithermd.model import Device, DeviceKind, Quantity, Reading, Status

_OK = Status.OK
TIERS = ((STUCK_SETTLE_S, STUCK_SWING_W), (STUCK_SLOW_S, STUCK_SLOW_SWING_W))  # (span s, swing W)


@dataclass(slots=True)
class _Span:
    """One tier's draws (t, W) of its last span, their sum, and the lowest/highest span mean (W) so far."""

    recent: deque[tuple[float, float]] = field(default_factory=deque)
    total: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf

    def add(self, t: float, draw: float, since: float, span: float) -> float:
        """Add a draw at ``t``; the spread (W) of the span means taken within the reading held ``since``."""
        recent = self.recent
        recent.append((t, draw))
        self.total += draw
        while len(recent) > 1 and recent[1][0] <= t - span:
            self.total -= recent.popleft()[1]
        if recent[0][0] > t - span or recent[0][0] < since:
            return 0.0  # no whole span of draws yet within this reading
        mean = self.total / len(recent)
        self.hi, self.lo = max(self.hi, mean), min(self.lo, mean)
        return self.hi - self.lo


@dataclass(slots=True)
class _Flat:
    """One unchanged reading: ``value`` (°C) since ``since`` (s); per tier its draws; ``why`` once judged."""

    value: float
    since: float
    spans: tuple[_Span, ...] = field(default_factory=lambda: tuple(_Span() for _ in TIERS))
    why: str | None = None


class DieWatch:
    """The draw floor and stuck check of each GPU's ``temperature`` (module doc). ``configure(devices)``
    per device set; ``judge(t, readings)`` per tick at monotonic ``t`` (s)."""

    def __init__(self) -> None:
        self.pairs: dict[str, tuple[str, float]] = {}  # temperature → (power channel, stuck checked under °C)
        self._flat: dict[str, _Flat] = {}

    def configure(self, devices: Iterable[Device]) -> None:
        pairs: dict[str, tuple[str, float]] = {}
        for d in devices:
            if d.kind != DeviceKind.GPU:
                continue
            by_id = {c.id: c for c in d.channels}
            temp, power = by_id.get(f"{d.id}/temperature"), by_id.get(f"{d.id}/power")
            if (temp is None or power is None or temp.quantity != Quantity.TEMPERATURE
                    or power.quantity != Quantity.POWER):
                continue
            own = [v for v in temp.thresholds.values() if v is not None and math.isfinite(v)]
            pairs[temp.id] = (power.id, min(own) - FIRMWARE_BAND_C if own else math.inf)
        self.pairs = pairs
        for cid in [c for c in self._flat if c not in pairs]:
            del self._flat[cid]

    def judge(self, t: float, readings: Mapping[str, Reading]) -> dict[str, Reading]:
        """The temperature readings of ``readings`` that are implausible by their draw, as implausible
        readings (empty: none)."""
        out: dict[str, Reading] = {}
        for cid, (pid, under) in self.pairs.items():
            r = readings.get(cid)
            if r is None or r.status is not _OK or r.value is None:
                self._flat.pop(cid, None)
                continue
            p = readings.get(pid)
            draw = p.value if p is not None and p.status is _OK and p.value is not None else None
            why = self._why(cid, pid, t, float(r.value), draw, under)
            if why is not None:
                out[cid] = Reading(cid, None, Status.IMPLAUSIBLE, why)
        return out

    def _why(self, cid: str, pid: str, t: float, v: float, draw: float | None, under: float) -> str | None:
        if draw is not None and math.isfinite(draw) and v < (floor := DIE_FLOOR_C + DIE_K_PER_W * draw):
            return (f"{v:g} °C under the {floor:.3g} °C a die drawing {draw:.4g} W ({pid}) sits at least "
                    f"(air above {DIE_FLOOR_C:g} °C + {DIE_K_PER_W:g} K/W)")
        flat = self._flat.get(cid)
        if flat is None or flat.value != v:
            flat = self._flat[cid] = _Flat(v, t)
        if flat.why is not None:
            return flat.why
        if draw is None or not math.isfinite(draw) or v >= under:
            return None
        for (span, swing), tier in zip(TIERS, flat.spans, strict=True):
            if tier.add(t, draw, flat.since, span) >= swing:
                flat.why = (f"stuck: {v:g} °C unchanged for {t - flat.since:.0f} s while the {span:g}-s "
                            f"mean of {pid} went from {tier.lo:.4g} W to {tier.hi:.4g} W (a die moves "
                            "≥ 2 °C)")
                return flat.why
        return None
