"""Splitting a power budget between devices by demand. Pure arithmetic on watts; no policy, no knobs.

:func:`split` gives each :class:`Consumer` a *target* (W):

1. a device that cannot be written (``fixed``) is charged the limit in force and gets nothing to share;
2. every other device gets its ``floor`` (its minimum limit) first — an idle device stays there while the
   budget is short;
3. busy devices share what is left above the floors by max-min fair water-filling, weighted by their
   utilization in quarters (25, 50, 75 or 100 %: a GPU training at 92–100 % weighs as much as another,
   a CPU feeding them at 40 % half as much, and the noise of utilization does not move the split): a
   device whose limit binds (it draws at least :data:`BINDS` of its limit) may use
   up to its ``ceiling`` (what its own rule asks); one that draws less asks only for its draw plus
   :data:`HEADROOM` and a step, so a GPU waiting on memory or a CPU feeding the GPUs takes what it uses
   and leaves the rest to those that would use more (1 / HEADROOM < BINDS, so a device given its draw plus
   headroom does not read as bound next tick);
4. what is left after that goes to the busy devices up to their ceilings, then to the idle ones up to
   theirs: when the budget is not short, every device keeps what its rule asks;
5. targets are rounded down to whole ``step_w`` above the floor (a ceiling is kept exact).

An idle device's floor is its minimum limit but at least :data:`IDLE_MARGIN` × its draw (within its
ceiling): a limit below what a device draws at idle frees nothing it could use, and a policy that reads
power as a share of the limit (``gpu.power_pct``) still sees an idle GPU at a third of its limit or less.

:func:`grant` then decides what to write this tick so that the limits in force never add up to more than
the budget, whatever order the writes land in and whichever of them fail: decreases are written at once,
and increases only out of the headroom left by the limits in force now (a limit being lowered still
counts at its old value until it reads back lower), so a device freed by another's decrease is raised one
tick later. Changes smaller than :data:`DEADBAND_STEPS` steps are not written unless the budget is
exceeded, so the noise of draw does not rewrite limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Draw under a cap (the Zeus sweeps, aithermd/sim/CALIBRATION.md): a training job capped at its own
# unbound draw still averages only ~0.89 of it — it draws in bursts the driver holds under the cap — and
# capped at 1.2 × its draw it averages ~0.97 of it. So a device drawing 85 % of its limit or more is
# held back by it, and one that draws less is given 1.25 × its draw: enough for ~97 % of what it would
# draw unbound, without reading as held back the next tick (0.97 / 1.2 ≈ 0.81 < 0.85).
BINDS = 0.85
RELEASE = 0.80  # a device held back stays so until it draws less than 80 % of its limit (hysteresis)
HEADROOM = 1.25
EPS_W = 1e-6
IDLE_MARGIN = 3.0  # an idle device keeps at least 3 × its draw
DEADBAND_STEPS = 3  # a change smaller than three steps waits


@dataclass(frozen=True, slots=True)
class Consumer:
    """One device under the budget, in W: ``floor`` (its minimum limit), ``ceiling`` (what its rule asks,
    ≥ floor), ``current`` (the limit in force now; None when unknown: charged at ``ceiling``), ``draw``
    (mean measured draw, None when unknown), ``util`` (mean utilization %, weight of its share), ``busy``,
    ``fixed`` (cannot be written: charged at ``current``), ``was_bound`` (held back by its limit last tick:
    it stays so until it draws less than :data:`RELEASE` of it)."""

    id: str
    floor: float
    ceiling: float
    current: float | None
    draw: float | None = None
    util: float | None = None
    busy: bool = True
    fixed: bool = False
    was_bound: bool = False

    @property
    def in_force(self) -> float:
        return self.current if self.current is not None else self.ceiling


@dataclass(frozen=True, slots=True)
class Share:
    """One device's part: ``target`` (W, the split), ``grant`` (W, what to set this tick), ``demand`` (W, what
    it asked for), ``why`` (``fixed`` | ``idle`` | ``bound`` | ``draw``: what its demand came from)."""

    target: float
    grant: float
    demand: float
    why: str


def demand(c: Consumer, step_w: float) -> tuple[float, str]:
    """(W, why) a busy device asks for: its ceiling when its limit binds or its draw is unknown, else its
    draw × :data:`HEADROOM` + one step, within [floor, ceiling]."""
    if c.draw is None or c.current is None or c.draw >= (RELEASE if c.was_bound else BINDS) * c.current:
        return c.ceiling, "bound"
    return min(c.ceiling, max(c.floor, c.draw * HEADROOM + step_w)), "draw"


def _fill(amount: float, caps: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """Max-min fair water-filling: up to ``caps[id]`` W each, in proportion to ``weights``; returns what
    each got (their sum ≤ ``amount``)."""
    got = {k: 0.0 for k in caps}
    open_ = {k for k, cap in caps.items() if cap > EPS_W}
    while open_ and amount > EPS_W:
        total_w = sum(weights[k] for k in open_)
        level = amount / total_w
        # the devices that reach their cap at this level are filled, the rest take the level
        full = {k for k in open_ if caps[k] - got[k] <= level * weights[k] + EPS_W}
        if not full:
            for k in open_:
                got[k] += level * weights[k]
            return got
        for k in full:
            amount -= caps[k] - got[k]
            got[k] = caps[k]
        open_ -= full
    return got


def _weight(util: float | None) -> float:
    """Utilization in quarters: 25, 50, 75 or 100 (unknown or not a finite number: 100)."""
    if util is None or not math.isfinite(util):
        return 100.0
    return 25.0 * min(4, max(1, round(util / 25.0)))


def floor_of(c: Consumer) -> float:
    """The lowest target of ``c``: its floor; for an idle device at least :data:`IDLE_MARGIN` × its draw."""
    if c.busy or c.draw is None:
        return c.floor
    return min(c.ceiling, max(c.floor, IDLE_MARGIN * c.draw))


def _round(floor: float, ceiling: float, value: float, step_w: float) -> float:
    if value >= ceiling - EPS_W:
        return ceiling
    return floor + int((value - floor + EPS_W) // step_w) * step_w


def split(budget_w: float, consumers: Sequence[Consumer], step_w: float = 5.0) -> dict[str, Share]:
    """Targets per device id (see the module doc); ``grant`` equals ``target`` here (see :func:`grant`)."""
    free = [c for c in consumers if not c.fixed]
    floors = {c.id: floor_of(c) for c in free}
    left = budget_w - sum(c.in_force for c in consumers if c.fixed) - sum(floors.values())
    busy = [c for c in free if c.busy]
    asks = {c.id: demand(c, step_w) for c in busy}
    weight = {c.id: _weight(c.util) for c in busy}
    extra = {c.id: 0.0 for c in free}
    if left > 0:
        got = _fill(left, {c.id: max(0.0, asks[c.id][0] - floors[c.id]) for c in busy}, weight)
        extra.update(got)
        left -= sum(got.values())
        for group in (busy, [c for c in free if not c.busy]):
            if left <= EPS_W:
                break
            caps = {c.id: c.ceiling - floors[c.id] - extra[c.id] for c in group}
            got = _fill(left, caps, {c.id: weight.get(c.id, 100.0) for c in group})
            for k, v in got.items():
                extra[k] += v
            left -= sum(got.values())
    out: dict[str, Share] = {}
    for c in consumers:
        if c.fixed:
            out[c.id] = Share(c.in_force, c.in_force, c.in_force, "fixed")
            continue
        target = _round(floors[c.id], c.ceiling, floors[c.id] + extra[c.id], step_w)
        ask, why = asks.get(c.id, (floors[c.id], "idle"))
        out[c.id] = Share(target, target, ask, why)
    return out


def grant(budget_w: float, consumers: Sequence[Consumer], shares: Mapping[str, Share],
          step_w: float = 5.0) -> dict[str, Share]:
    """``shares`` with ``grant`` set to what may be written this tick (see the module doc). Raises are
    granted busy devices first, the largest shortfall first."""
    in_force = sum(c.in_force for c in consumers)
    over = in_force > budget_w + EPS_W
    headroom = budget_w - in_force
    band = DEADBAND_STEPS * step_w - EPS_W
    out: dict[str, Share] = {}
    raises: list[Consumer] = []
    for c in consumers:
        s = shares[c.id]
        if c.fixed or c.current is None:
            out[c.id] = s  # unknown limit in force: write the target (it was charged at the ceiling)
            continue
        if s.target < c.current - EPS_W:
            lower = over or c.current - s.target >= band
            out[c.id] = Share(s.target, s.target if lower else c.current, s.demand, s.why)
        elif s.target > c.current + EPS_W:
            raises.append(c)
        else:
            out[c.id] = Share(s.target, c.current, s.demand, s.why)
    raises.sort(key=lambda c: (not c.busy, -(shares[c.id].target - (c.current or 0.0))))
    for c in raises:
        s, cur = shares[c.id], c.current or 0.0
        up = min(s.target, cur + max(0.0, headroom))
        if up - cur < band:
            out[c.id] = Share(s.target, cur, s.demand, s.why)
            continue
        headroom -= up - cur
        out[c.id] = Share(s.target, up, s.demand, s.why)
    return out
