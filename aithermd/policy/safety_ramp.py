"""After the safety layer's power cut releases, a ceiling that rises step by step. Pure.

Without it, the latch's release (:mod:`aithermd.policy.safety_latch`) handed a power limit straight back to
its policy, whose value (often the default: the efficient-limit search re-measures its baseline there) was
the very one that had tripped: the card was over its trip point again within seconds and cut deeper, a
300 → 111 → 300 W sawtooth every ~30 s. As a thermal governor's step-wise release does, each power knob the
cut held (a GPU's ``power_limit``, the RAPL PL1/PL2 a CPU chip's cut sends to their minimum) gets a
**ceiling** instead:

- it starts at the cut the latch held (never above it) and rises by :data:`STEP_FRAC` of the knob's maximum
  once the channel has read at least :data:`~aithermd.policy.safety_latch.RELEASE_C` under its trigger for
  :data:`STEP_HOLD_S` seconds since the last step; a reading in that margin holds it where it is; none (a
  failed or implausible sensor: the readings that let it rise are in doubt, attack5 C1) takes it back to
  the cut it started from; and a step needs the reading to have changed since the last one (a sign of
  life: a frozen sensor reading a steady 40 °C raised a cut from 208 to 598 W under a die past its trip
  point, attack5 C1; a live die's whole-degree reading moves within 30 s under a load);
- a new trip during the ramp is the latch's again (cut in proportion, at once, never above the ceiling);
  the ceiling that tripped is remembered for :data:`TRIPPED_MEMORY_S` and the next ramp stops one step
  under it — the last value that held the temperature — so a card that trips at its policy's value settles
  there instead of cycling;
- the ramp ends once the ceiling reaches the knob's maximum, and with its device (gone from the devices);
- it is a ceiling, not a value (:func:`aithermd.policy.arbiter.merge`): a policy, hold or override under it
  stands, and one above it gets the ceiling; a knob nobody decides gets the ceiling until it reaches the
  knob's default, then is given back. It never raises anything.

So a released limit changes at most every :data:`STEP_HOLD_S` (2 a minute) and stays at or under what the
policy asks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aithermd.model import Decision, Knob, Layer
from aithermd.policy.arbiter import CEILING_RULE
from aithermd.policy.safety_latch import RELEASE_C
from aithermd.units import num

# One step is 5 % of the knob's maximum: on the calibrated coolers (aithermd/sim/gpu_sim.py, CALIBRATION.md)
# that is +1.7 K in steady state — fan-cooled 4090 reference 22.5 W × (0.05 K/W die + 1/36 K/W heatsink at
# load duty), passive H100 35 W × (0.025 + 1/46) — under the 3 °C release margin, so a step from a
# temperature that held under the margin does not by itself reach the trip point.
STEP_FRAC = 0.05
# A step waits 30 s of calm: two heatsink time constants of the fan-cooled cards (τ ≈ 15 s,
# FAN_HEAT_CAPACITY), one of the passive boards (τ ≈ 30 s): most of the last step's rise has shown by then.
# Also the latch's own RELEASE_HOLD_S: the ramp moves no faster than the latch releases (≤ 2 changes/min).
STEP_HOLD_S = 30.0
# A ceiling that tripped is not tried again for 10 minutes (~20 fan-cooled heatsink τ): long enough to
# settle a steady load, short enough that a lighter job gets its policy's value back in a few steps.
TRIPPED_MEMORY_S = 600.0
KEY = "ramp:"  # the ramps' keys among the latches (channel ids never start with it)


@dataclass(frozen=True, slots=True)
class Ramp:
    """One knob's ceiling (W) after ``channel``'s cut released (``trigger_c`` its trigger, °C): raised last
    at ``changed`` (monotonic s); ``cool_since`` when the channel last began reading under the margin
    (None: not now); ``stop_w`` the last ceiling that held, until ``stop_until`` (None: none remembered);
    ``tripped`` the latch (its ``since``) already counted against this ramp; ``decision`` its ceiling."""

    knob_id: str
    channel: str
    trigger_c: float
    ceiling: float
    step: float
    top: float
    changed: float
    cool_since: float | None = None
    stop_w: float | None = None
    stop_until: float = 0.0
    tripped: float | None = None
    decision: Decision | None = None
    low: float | None = None  # the cut it started from (W): where an unreadable channel takes it back
    last_c: float | None = None  # the channel's last reading (°C)
    moved: bool = False  # whether that reading changed since the ceiling last moved


def _decision(r: Ramp, knob: Knob, now: float) -> Decision:
    u = knob.unit
    stop = (f"; not above {num(r.stop_w)} {u} until {TRIPPED_MEMORY_S / 60:g} min after it tripped one step "
            "higher" if r.stop_w is not None and now < r.stop_until else "")
    why = (f"{r.channel}'s critical cut released: {r.knob_id} at most {num(r.ceiling)} {u}, rising "
           f"{num(r.step)} {u} per {STEP_HOLD_S:g} s while {r.channel} stays ≤ "
           f"{r.trigger_c - RELEASE_C:g} °C (trigger {r.trigger_c:g} °C − {RELEASE_C:g} °C){stop}")
    inputs = {"ceiling": round(r.ceiling, 2), "step": round(r.step, 2), "hold_s": STEP_HOLD_S,
              "release_below_c": round(r.trigger_c - RELEASE_C, 2)}
    if r.stop_w is not None and now < r.stop_until:
        inputs["tripped_above"] = round(r.stop_w, 2)
    return Decision(knob_id=r.knob_id, value=r.ceiling, layer=Layer.SAFETY, rule=CEILING_RULE, reason=why,
                    requested=r.ceiling, inputs=inputs)


def start(knob: Knob, channel: str, trigger_c: float, cut: float | None, prev: Ramp | None,
          now: float) -> Ramp | None:
    """The ramp of ``knob`` once ``channel``'s latch released with the knob cut to ``cut`` (W; None: no
    cut to start from). None when the knob has no maximum to rise to, or the cut is at it already."""
    if cut is None or knob.max is None:
        return None
    cut = knob.clamp(cut)
    if prev is not None:
        cut = min(cut, prev.ceiling)
    if cut >= knob.max:
        return None
    r = Ramp(knob.id, channel, trigger_c, cut, STEP_FRAC * knob.max, knob.max, now, now,
             prev.stop_w if prev else None, prev.stop_until if prev else 0.0, low=cut)
    return replace(r, decision=_decision(r, knob, now))


def tripped(r: Ramp, latch_since: float, now: float) -> Ramp:
    """``r`` once its channel latched again (at ``latch_since``): the ceiling in force did not hold, so the
    next ramp stops a step under it for :data:`TRIPPED_MEMORY_S`."""
    if r.tripped == latch_since:
        return r
    return replace(r, tripped=latch_since, stop_w=r.ceiling - r.step, stop_until=now + TRIPPED_MEMORY_S,
                   cool_since=None)


def step(r: Ramp, value_c: float | None, trigger_c: float | None, now: float) -> Ramp | None:
    """``r`` after its channel read ``value_c`` (°C; None: unreadable) at ``now``; None once it reached its
    top (the knob is the policy's again). ``trigger_c``: the channel's trigger now (None: keep the old)."""
    trig = r.trigger_c if trigger_c is None else trigger_c
    ceiling, cool = r.ceiling, None
    alive = r.moved or (value_c is not None and r.last_c is not None and value_c != r.last_c)
    if value_c is None and r.low is not None:
        ceiling = min(ceiling, r.low)
    elif value_c is not None and value_c <= trig - RELEASE_C:
        cool = now if r.cool_since is None else r.cool_since
        if now - max(cool, r.changed) >= STEP_HOLD_S - 1e-9 and alive:
            cap = r.top if r.stop_w is None or now >= r.stop_until else min(r.top, r.stop_w)
            ceiling = max(ceiling, min(ceiling + r.step, cap))  # under a remembered trip: no step
            if ceiling >= r.top - 1e-9:
                return None
    moved = ceiling != r.ceiling
    alive = alive and not moved
    if (not moved and cool == r.cool_since and trig == r.trigger_c and alive == r.moved
            and value_c == r.last_c):
        return r
    return replace(r, ceiling=ceiling, cool_since=cool, trigger_c=trig, changed=now if moved else r.changed,
                   decision=None if moved or trig != r.trigger_c else r.decision, last_c=value_c, moved=alive)


def decision(r: Ramp, knob: Knob, now: float) -> tuple[Ramp, Decision]:
    """The ceiling's decision (the same object while the ramp does not move) and the ramp keeping it."""
    if r.decision is not None:
        return r, r.decision
    d = _decision(r, knob, now)
    return replace(r, decision=d), d
