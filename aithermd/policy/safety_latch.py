"""How long the safety layer holds a critical temperature's cut, and how deep it cuts. Pure.

A GPU's temperature follows its power within a second (the die over its heatsink: the recorded RTX 4090
goes 35 → 49 °C in 3 s when ~300 W start and 55 → 38 °C in 6 s when they stop). A cut from the maximum to
the minimum therefore drops the temperature under the trigger at once, the release puts the power back,
and the temperature is over the trigger again a second later: the safety layer swung four simulated H100s
between maximum and minimum ~90 times each in 20 minutes. So, per latched channel:

- **proportional**: the power limit goes to the draw the device had when it latched (never above the limit
  then in force: a glitched reading is no reference, :func:`aithermd.policy.safety.latch_draw_w`), less
  :data:`CUT_PER_C` per whole °C at and above the trigger (10 % at the trigger, 20 % one degree over, …),
  never under the limit's minimum; at the device's own threshold (the trigger plus the margin: the driver's
  slowdown) it goes to the minimum at once, as before;
- **deeper only, and not too often**: within a latch the cut only deepens, at most every
  :data:`HOLD_S` seconds (the jump to the minimum does not wait); it never creeps back up;
- **a cut that binds**: a cut the device's mean draw stayed under :data:`UNBOUND` of for a whole
  :data:`HOLD_S` (its reference was a glitch, or the job's demand fell) takes the highest draw of that time as
  its reference, so it cuts again from what the device really draws (attack8 T1: a reference from a 2×
  reading left the cut at 304 W over a 230 W draw); a cut that binds holds the draw near it (the Zeus sweeps:
  ~0.9 of a cap at the job's own draw), so this does not deepen it further;
- **released with a margin and a hold, on a live reading**: the latch ends only once the temperature has
  stayed :data:`RELEASE_C` under the trigger for :data:`RELEASE_HOLD_S` seconds and its reading moved in
  that time (a reading that jumped under the margin and froze there is no sign the die cooled: attack5
  C1; a sensor found failed keeps the latch as before); then the limit climbs back to the
  policy's under a rising ceiling (:mod:`aithermd.policy.safety_ramp`), not at once: the policy's value was
  what tripped it.

So a temperature hovering at its trip point changes a knob at most every 10 s while it rises, and its latch
at most once per 30 s of calm: never more than 6 changes a minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

RELEASE_C = 3.0
RELEASE_HOLD_S = 30.0
HOLD_S = 10.0
CUT_PER_C = 0.10
UNBOUND = 0.85  # a mean draw under this share of the cut over a whole HOLD_S: the cut does not bind (a binding
# cap holds a bursty job's mean near 0.9 of it: the Zeus sweeps, sim/CALIBRATION.md §1)
MIN_LEVEL = 99  # the cut level meaning "the minimum"


@dataclass(frozen=True, slots=True)
class Latch:
    """One critical channel: latched at ``since`` (monotonic s) with the device drawing ``ref_w`` (None:
    unknown), cut at ``level`` (0: 10 % off, each level 10 % more, :data:`MIN_LEVEL`: the minimum) since
    ``changed``; ``cool_since`` when it first read :data:`RELEASE_C` under the trigger (None: not cool)."""

    since: float
    ref_w: float | None
    level: int
    changed: float
    cool_since: float | None = None
    last_c: float | None = None  # the last reading while cool (°C)
    moved: bool = False  # whether the reading changed since cool_since
    seen_w: float | None = None  # the highest draw read since ``changed``, after that tick (W)
    sum_w: float = 0.0  # the draws read since ``changed``, after that tick (W), and how many
    reads: int = 0


def level_for(value_c: float, trigger_c: float, threshold_c: float | None) -> int:
    """The cut level a reading asks for (see the module docstring)."""
    if threshold_c is not None and value_c >= threshold_c:
        return MIN_LEVEL
    return max(0, int(math.floor(value_c - trigger_c)))


def step(prev: Latch | None, value_c: float, trigger_c: float, threshold_c: float | None, now: float,
         draw_w: float | None) -> Latch | None:
    """The channel's latch after reading ``value_c`` at ``now`` with the device drawing ``draw_w`` (W; None:
    unknown); None when it is not (or no longer) critical."""
    if prev is None:
        if value_c < trigger_c:
            return None
        return Latch(now, draw_w, level_for(value_c, trigger_c, threshold_c), now)
    if value_c <= trigger_c - RELEASE_C:
        cool = prev.cool_since if prev.cool_since is not None else now
        moved = prev.cool_since is not None and (prev.moved or value_c != prev.last_c)
        if moved and now - cool >= RELEASE_HOLD_S - 1e-9:
            return None
        return replace(prev, cool_since=cool, last_c=value_c, moved=moved)
    level = level_for(value_c, trigger_c, threshold_c)
    held = now - prev.changed >= HOLD_S - 1e-9
    if prev.level != MIN_LEVEL and level > prev.level and (level == MIN_LEVEL or held):
        return replace(prev, level=level, changed=now, cool_since=None, moved=False, seen_w=None, sum_w=0.0,
                       reads=0)
    if draw_w is not None and prev.ref_w is not None and prev.level != MIN_LEVEL and now > prev.changed:
        seen = draw_w if prev.seen_w is None else max(prev.seen_w, draw_w)
        total, reads = prev.sum_w + draw_w, prev.reads + 1
        cut = prev.ref_w * (1.0 - CUT_PER_C * (1 + prev.level))
        # the cut never bound (the mean draw of a whole hold far under it: one reading near it does not
        # hold a cut that limits nothing, attack9 N2): cut again from the highest draw of the hold
        if held and total / reads < UNBOUND * cut:  # (a reading over the cut is no draw to cut from)
            return replace(prev, ref_w=min(seen, cut), changed=now, cool_since=None, moved=False, seen_w=None,
                           sum_w=0.0, reads=0)
        prev = replace(prev, seen_w=seen, sum_w=total, reads=reads)
    return replace(prev, cool_since=None, moved=False) if prev.cool_since is not None else prev


def power_target_w(latch: Latch, minimum_w: float | None) -> float | None:
    """The power limit (W) a latch asks for: the latched draw less the cut, never under ``minimum_w``
    (None: the knob's minimum is unknown and there is no draw to cut from)."""
    if latch.level == MIN_LEVEL or latch.ref_w is None:
        return minimum_w
    cut = latch.ref_w * (1.0 - CUT_PER_C * (1 + latch.level))
    return cut if minimum_w is None else max(minimum_w, cut)
