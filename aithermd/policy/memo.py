"""No work for unchanged inputs: a fan rule's decision for one knob, kept while nothing it depends on moves.

A fan target's decision is a function of the rule (compiled for this machine: its curves, model and the
knob's calibration; a reload compiles a new one), the layer and policy it decides for, its leaf curves'
source temperatures this tick (smoothed where asked; a failed or untrusted input changes them), their
previous curve states, the duty the fan was last given (an override or the safety layer setting it
elsewhere changes that), and for its explanation the machines' statistics, the rule's own ``when``
statistics and the earlier rules' progress. :class:`FanMemo` keeps those inputs with the decision and the
curve states it left; :func:`reuse` gives the same Decision object back when every one is equal.

Time enters a fan's duty only through a PID curve (its integral and derivative) and the ramps; so a rule
that reaches a PID curve is never kept, and a decision is kept only when it is *steady*: the duty it asks
is the one the fan already had and shaping without ramps gives the same (a fan still ramping, or kicked
to start, is worked out again each tick). The ``when`` condition, the safety layer, overrides and
arbitration are evaluated every tick as before; only the curve, the shaping and the explanation are saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.model import Decision, Layer, Status
from aithermd.policy.curves import CurveState, FanState
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
    states: tuple[CurveState | None, ...]  # the curve states it was worked out from, in rule.curves order
    last: float | None
    decision: Decision
    out: tuple[tuple[str, CurveState], ...]  # the curve states it left (key in the policy's curves, state)


def last_duty(t: Target, inp: Any, fans: Mapping[str, FanState]) -> float | None:
    """The duty ``t``'s fan was last given (the engine's memory), else as read back, else None."""
    prev = fans.get(t.knob.id)
    if prev is not None:
        return prev.duty_pct
    kv = inp.knobs.get(t.knob.id)
    return kv.value if kv is not None and kv.status == Status.OK else None


def states_in(rule: CRule, prefix: str,
              prev_curves: Mapping[str, CurveState]) -> tuple[CurveState | None, ...]:
    """One target's previous curve states (``prefix``: ``<rule>|<knob id>|``), in ``rule.curves`` order."""
    get = prev_curves.get
    return tuple(get(prefix + n) for n in rule.curves)


def reuse(memo: FanMemo, rule: CRule, layer: Layer, policy: str, temps: Mapping[str, float],
          raw: Mapping[str, float], used: Mapping[str, str], before: tuple[Mapping[str, Any], ...],
          states: tuple[CurveState | None, ...], last: float | None) -> bool:
    """Whether ``memo`` holds this tick's decision: every input equal (the rule the same object)."""
    return (memo.rule is rule and memo.last == last and memo.layer is layer
            and memo.policy == policy and memo.temps == temps and memo.states == states
            and memo.before == before and memo.raw == raw and memo.used == used)
