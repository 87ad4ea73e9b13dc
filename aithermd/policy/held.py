"""Held-high idle: a GPU with no work that draws far above its own idle floor. Pure.

A card that keeps a CUDA context (a notebook kernel, an inference server between requests, a crashed job's
zombie) or is stuck in a high P-state idles well above its floor: the recorded RTX 4090 trace idles at
34–38 W while its process holds 1.1–17 GB, against 17.6 W at P8 with nothing held in the Windows 4090
trace and 20 W in the 8× RTX 4090 dump; the RTX 4060 Ti dump idles at P0, 30.5 W, 0 %. Per GPU:

- its **idle floor** is learned: the lowest 30 s median of its power while it has no work (utilization at
  most :data:`IDLE_UTIL_PCT`, the blips of an idle card) (and,
  where NVML reports a P-state, while the card sits in a low one, P5 or deeper: a card held at P0/P2
  never teaches its held draw as its floor), over the daemon's life; until one is seen,
  :data:`FALLBACK_SHARE` of its default power limit (consumer boards idle at 4–8 % of theirs in the
  project's dumps; datacenter boards, which idle at P0, at 10–12 %: A100 60 W of 500, H100 70 W of 700,
  H200 77 W of 700);
- a card NVML reports in a low P-state is at its floor state, whatever it draws (the RTX 2080 SUPER dump
  idles at P8 drawing 15 % of its limit);
- it is **held high** once it has had no work for :data:`SUSTAIN_S` and its power has stayed at least
  :data:`RATIO` × the floor and :data:`MIN_EXCESS_W` above it the whole time; it stays held, whatever it
  draws then (a policy may have locked its clocks to the minimum: the draw falls, the hold does not), until
  work returns or NVML reports it in a low P-state (the process let go). ``held_w`` is what it drew when
  found held: ``held_w − power_w`` is what a clock lock recovered.

The result per GPU (:class:`HeldIdle`) goes into the snapshot (status, TUI, metrics) and, as
``gpu<N>/held_idle_w`` (the excess in W, 0 when not held), into what policies read
(``metric: gpu.held_idle_w``), so a rule can lock the clocks to their minimum until work returns.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.model import Device, DeviceKind, KnobKind, Reading, Status

SUSTAIN_S = 60.0
IDLE_UTIL_PCT = 5.0  # "no work": an idle card's utilization blips to 1–4 % (the RTX 4090 trace: p90 2.6 %)
RATIO = 1.5
MIN_EXCESS_W = 8.0
FLOOR_WINDOW = 30  # idle samples whose median is a floor candidate
FALLBACK_SHARE = {"consumer": 0.06, "datacenter": 0.10}
LOW_PSTATE = 5  # P5 and deeper are idle states (P8 at idle on consumer boards)
CHANNEL = "held_idle_w"


@dataclass(frozen=True, slots=True)
class GpuIdle:
    """One GPU's memory: the learned ``floor_w`` (None: not seen yet), the last idle powers, and since when
    it has been idle and high (``since``: None when not)."""

    floor_w: float | None = None
    recent: tuple[float, ...] = ()
    since: float | None = None
    held_w: float | None = None  # the draw when it was found held (None: not held)


@dataclass(frozen=True, slots=True)
class HeldIdle:
    """A GPU held high while idle: since ``since`` (monotonic s), drawing ``power_w`` now and ``held_w``
    when found held, against its ``floor_w`` (``learned`` or the fallback), ``pstate``."""

    gpu: str
    since: float
    power_w: float
    floor_w: float
    learned: bool
    pstate: str | None
    held_w: float = 0.0

    @property
    def recovered_w(self) -> float:
        """What the draw fell since it was found held (a clock lock's saving)."""
        return max(0.0, self.held_w - self.power_w)

    @property
    def excess_w(self) -> float:
        return max(0.0, self.power_w - self.floor_w)


def _value(r: Reading | None) -> float | None:
    if r is None or r.status != Status.OK or r.value is None or r.value != r.value:
        return None
    return float(r.value)


def _pstate_number(pstate: Any) -> int:
    """``"P8"`` → 8; unknown (None, ``"P?"``) → -1 (not a low state)."""
    text = str(pstate or "").lstrip("Pp")
    return int(text) if text.isdigit() else -1


def fallback_floor_w(device: Device) -> float | None:
    """The floor to judge by before one is learned: a share of the default limit (see the module doc)."""
    knob = next((k for k in device.knobs if k.kind == KnobKind.POWER_LIMIT), None)
    if knob is None or knob.default is None:
        return None
    fans = any(k.kind == KnobKind.FAN for k in device.knobs)
    return knob.default * FALLBACK_SHARE["consumer" if fans else "datacenter"]


def update(prev: Mapping[str, GpuIdle], devices: tuple[Device, ...], readings: Mapping[str, Reading],
           attrs: Mapping[str, Mapping[str, Any]],
           now: float) -> tuple[dict[str, GpuIdle], dict[str, HeldIdle]]:
    """One tick: each GPU's new memory and the GPUs held high now."""
    state: dict[str, GpuIdle] = {}
    held: dict[str, HeldIdle] = {}
    for d in devices:
        if d.kind != DeviceKind.GPU:
            continue
        g = prev.get(d.id, GpuIdle())
        util, power = _value(readings.get(f"{d.id}/utilization")), _value(readings.get(f"{d.id}/power"))
        if util is None or power is None or util > IDLE_UTIL_PCT:
            # busy (the usual tick of a working GPU): its memory as it was, with nothing recent
            state[d.id] = g if not g.recent and g.since is None and g.held_w is None else GpuIdle(g.floor_w)
            continue
        pstate = (attrs.get(d.id) or {}).get("pstate")
        low = _pstate_number(pstate) >= LOW_PSTATE
        if g.held_w is not None and not low:  # held: it stays so until work returns
            judge = g.floor_w if g.floor_w is not None else fallback_floor_w(d)
            state[d.id] = g
            held[d.id] = HeldIdle(d.id, g.since or now, power, judge or 0.0, g.floor_w is not None, pstate,
                                  g.held_w)
            continue
        recent = (g.recent + (power,))[-FLOOR_WINDOW:] if low or pstate is None else g.recent
        floor = g.floor_w
        if len(recent) == FLOOR_WINDOW:
            median = statistics.median(recent)
            floor = median if floor is None else min(floor, median)
        judge = floor if floor is not None else fallback_floor_w(d)
        high = (not low and judge is not None and power >= RATIO * judge
                and power - judge >= MIN_EXCESS_W)
        since = (g.since if g.since is not None else now) if high else None
        found = high and since is not None and now - since >= SUSTAIN_S - 1e-9
        state[d.id] = GpuIdle(floor, recent, since, power if found else None)
        if found:
            held[d.id] = HeldIdle(d.id, since, power, judge, floor is not None, pstate,  # type: ignore[arg-type]
                                  power)
    return state, held


def derived_readings(devices: tuple[Device, ...], held: Mapping[str, HeldIdle]) -> dict[str, Reading]:
    """``gpu<N>/held_idle_w`` for every GPU: the excess of a held-high GPU, else 0."""
    out = {}
    for d in devices:
        if d.kind == DeviceKind.GPU:
            cid = f"{d.id}/{CHANNEL}"
            h = held.get(d.id)
            out[cid] = Reading(cid, round(h.excess_w, 1) if h is not None else 0.0)
    return out
