"""Arbitration: per knob the strongest layer wins — safety > operator override > hold > active policy — and
every value is clamped to the knob's own constraints (duty knobs also to 0–100 %).

A knob no layer decides is absent from the result: the daemon hands it back (restores what it found).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from aithermd.model import LAYER_RANK, Decision, Knob, KnobKind, Layer

DUTY_KINDS = (KnobKind.PWM, KnobKind.FAN)


def clamp(knob: Knob, value: float) -> float:
    """``value`` within the knob's [min, max]; duty knobs also within 0–100 %."""
    value = knob.clamp(value)
    if knob.kind in DUTY_KINDS:
        value = min(max(value, 0.0), 100.0)
    return value


def clamped(knob: Knob, decision: Decision) -> Decision:
    """``decision`` with ``value`` clamped to ``knob`` and ``requested`` kept (set from value when absent)."""
    if decision.value is None:
        return decision
    requested = decision.requested if decision.requested is not None else decision.value
    value = clamp(knob, decision.value)
    if value == decision.value and requested == decision.requested:
        return decision
    return replace(decision, value=value, requested=requested)


def override_decisions(overrides: Mapping[str, float], knobs: Mapping[str, Knob]) -> dict[str, Decision]:
    """Operator overrides (knob id → value, daemon units) as OVERRIDE decisions; unknown knobs are ignored."""
    out = {}
    for knob_id, value in overrides.items():
        knob = knobs.get(knob_id)
        if knob is None or value is None or value != value:
            continue
        out[knob_id] = Decision(knob_id=knob_id, value=float(value), layer=Layer.OVERRIDE, rule="override",
                                reason=f"operator override to {float(value):g} {knob.unit}".rstrip(),
                                requested=float(value))
    return out


def merge(layers: Iterable[Mapping[str, Decision]], knobs: Mapping[str, Knob]) -> dict[str, Decision]:
    """The winning, clamped decision per knob. ``layers`` may come in any order: the rank of each decision's
    layer decides, and among equal ranks the later mapping wins (a later hold over an earlier one)."""
    winners: dict[str, Decision] = {}
    for layer in layers:
        for knob_id, dec in layer.items():
            knob = knobs.get(knob_id)
            if knob is None:
                continue
            cur = winners.get(knob_id)
            if cur is None or LAYER_RANK[dec.layer] <= LAYER_RANK[cur.layer]:
                winners[knob_id] = dec
    return {k: clamped(knobs[k], d) for k, d in winners.items()}
