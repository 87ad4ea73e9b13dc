"""No work for unchanged inputs: a fan rule's decision for one knob, kept while nothing it depends on moves.

A fan target's decision is a function of the rule (compiled for this machine: its curves, model and the
knob's calibration; a reload compiles a new one), the layer and policy it decides for, its leaf curves'
source temperatures this tick (smoothed where asked; a failed or untrusted input changes them), their
previous curve states, the duty the fan was last given (an override or the safety layer setting it
elsewhere changes that), and for its explanation the machines' statistics, the rule's own ``when``
statistics and the earlier rules' progress. :class:`FanMemo` keeps those inputs with the decision and the
curve states it left; :func:`reuse` tells when every input of the duty is equal: the same Decision object
is given back when the explanation's statistics are equal too, else (a machine's window statistic or a
timer's progress moved, the duty's inputs did not) a new Decision with the same duty explained by this
tick's statistics (:func:`explained`): the curves and the shaping are not worked out again.

Time enters a fan's duty only through a PID curve (its integral and derivative) and the ramps, so a
decision is kept only when it is *steady*: the duty it asks is the one the fan already has and shaping
without ramps gives the same (a fan still ramping, or kicked to start, is worked out again each tick), and
every curve state it left is the one it came from (:func:`left`): a points curve's reference temperature,
a PID's error and integral with the integral pinned at its anti-windup bound by an error that pushes
against it (or no error at all), so that no time step moves it; such a PID state is carried with this
tick's time (:func:`carry`). The ``when`` conditions, the safety layer, overrides and arbitration are
evaluated every tick as before; only the curve, the shaping and the explanation are saved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.model import Decision, Layer, Status
from aithermd.policy.curves import CurveState, FanState, pid_pinned
from aithermd.policy.kinds import PidCurve
from aithermd.policy.plan import CRule, Target


@dataclass(frozen=True, slots=True)
class FanMemo:
    rule: CRule
    layer: Layer
    policy: str
    temps: Mapping[str, float]
    raw: Mapping[str, float]
    used: Mapping[str, str]
    before: tuple[Mapping[str, Any], ...]
    states: tuple[Any, ...]  # the curve states it was worked out from, without their times (states_in)
    last: float | None
    decision: Decision
    out: tuple[tuple[str, CurveState], ...]  # the curve states it left (key in the policy's curves, state)
    curve_pct: float | None  # the curve's own duty (for the explanation), None for a fixed duty


def last_duty(t: Target, inp: Any, fans: Mapping[str, FanState]) -> float | None:
    """The duty ``t``'s fan was last given (the engine's memory), else as read back, else None."""
    prev = fans.get(t.knob.id)
    if prev is not None:
        return prev.duty_pct
    kv = inp.knobs.get(t.knob.id)
    return kv.value if kv is not None and kv.status == Status.OK else None


def bare(st: CurveState | None) -> tuple[float | None, float, float | None] | None:
    """A curve state without its time (a pinned PID's time does not change what it gives)."""
    return None if st is None else (st.ref_c, st.integral, st.prev_err)


def bare_all(states: Iterable[CurveState | None]) -> tuple[Any, ...]:
    """:func:`bare` of each of ``states`` (one call, no generator made per tick)."""
    out = []
    for st in states:
        out.append(None if st is None else (st.ref_c, st.integral, st.prev_err))
    return tuple(out)


def states_in(keys: Mapping[str, str], prev_curves: Mapping[str, CurveState]) -> tuple[Any, ...]:
    """One target's previous curve states without their times (``keys``: curve name → its key in the
    policy's curve states), in the rule's curve order."""
    return bare_all(map(prev_curves.get, keys.values()))


def left(rule: CRule, keys: Mapping[str, str], states: tuple[Any, ...], out_curves: Mapping[str, CurveState],
         now: float) -> tuple[tuple[str, CurveState], ...] | None:
    """The curve states a decision left, when each is the one it came from (``states``) and no time step
    can move it (see the module doc); None when one is not, and the decision is not kept."""
    out = []
    for (name, key), before in zip(keys.items(), states, strict=True):
        st = out_curves.get(key)
        if st is None:
            if before is not None:
                return None
            continue
        if (st.ref_c, st.integral, st.prev_err) != before:  # bare(st), inline
            return None
        curve = rule.curves[name]
        if isinstance(curve, PidCurve) and not (st.t == now and pid_pinned(curve, st)):
            return None
        out.append((key, st))
    return tuple(out)


def carry(memo: FanMemo, now: float, out_curves: dict[str, CurveState]) -> None:
    """The curve states of a kept decision into this tick's, a PID's with this tick's time."""
    for key, st in memo.out:
        out_curves[key] = st if st.t is None else CurveState(st.ref_c, st.integral, st.prev_err, now)


def reuse(memo: FanMemo, rule: CRule, layer: Layer, policy: str, temps: Mapping[str, float],
          raw: Mapping[str, float], used: Mapping[str, str], prior: tuple[CurveState | None, ...],
          last: float | None) -> bool:
    """Whether ``memo`` holds this tick's duty: every input of it equal (the rule the same object;
    ``prior``: the previous curve states in the rule's curve order, compared last, without their times).
    The explanation's statistics (``before``) are not among them: when only they moved, the caller keeps
    the duty and the curve states and builds the decision again with them (:func:`explained`)."""
    if not (memo.rule is rule and memo.temps == temps and memo.last == last and memo.layer is layer
            and memo.policy == policy and memo.raw == raw and memo.used == used):
        return False
    for st, was in zip(prior, memo.states, strict=True):  # bare_all(prior) == memo.states, inline
        if (None if st is None else (st.ref_c, st.integral, st.prev_err)) != was:
            return False
    return True


def explained(memo: FanMemo, before: tuple[Mapping[str, Any], ...], inputs: Mapping[str, Any]) -> FanMemo:
    """``memo`` with its decision explained by this tick's ``before`` (the machines' and the rule's
    statistics, the earlier rules' progress) and ``inputs`` built from them: the same duty, the same
    curve states."""
    d = memo.decision
    dec = Decision(knob_id=d.knob_id, value=d.value, layer=d.layer, rule=d.rule, reason=d.reason,
                   requested=d.requested, inputs=inputs)
    return FanMemo(memo.rule, memo.layer, memo.policy, memo.temps, memo.raw, memo.used, before, memo.states,
                   memo.last, dec, memo.out, memo.curve_pct)
