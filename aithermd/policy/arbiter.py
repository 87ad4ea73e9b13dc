"""Arbitration: per knob the strongest layer wins — safety > operator override > hold > active policy — and
every value is clamped to the knob's own constraints (duty knobs also to 0–100 %).

One kind of safety decision is a *ceiling*, not a value: :data:`CEILING_RULE`, the rising limit after a
critical cut released (:mod:`aithermd.policy.safety_ramp`). It takes no part in the ranking; the winner
of the other layers stands where it is at or under the ceiling, and gets the ceiling where it is above
(the decision then is the ceiling's, saying what it capped). Another safety decision (a critical cut) is
not capped. A knob nobody else decides gets the ceiling while it is under the knob's default, and is
handed back after that. A ceiling never raises a value.

A knob no layer decides is absent from the result: the daemon hands it back (restores what it found).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from aithermd.model import LAYER_RANK, Decision, Knob, KnobKind, Layer
from aithermd.units import num

DUTY_KINDS = (KnobKind.PWM, KnobKind.FAN)
# A safety decision that is a ceiling, not a cut: the limit rising after a critical cut released
# (safety_ramp.py). Arbitration takes it as a min over the other layers; the applier writes it like any
# value (a limit read back under it does not hold it: the ceiling is there to let the limit rise).
CEILING_RULE = "safety/release-ramp"


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


def capped(knob: Knob, winner: Decision | None, ceiling: Decision) -> Decision | None:
    """What a ``ceiling`` (a :data:`CEILING_RULE` decision) makes of the other layers' ``winner`` (clamped;
    None: nobody decided the knob): see the module doc. None: the knob is handed back."""
    limit = clamp(knob, ceiling.value) if ceiling.value is not None else None
    if limit is None:
        return winner
    if winner is None or winner.value is None:
        return None if knob.default is not None and limit >= knob.default else clamped(knob, ceiling)
    if winner.layer == Layer.SAFETY or winner.value <= limit:
        return winner
    return replace(ceiling, value=limit, requested=ceiling.value,
                   reason=f"{ceiling.reason}; {winner.rule} asked {num(winner.value)} {knob.unit}".rstrip(),
                   inputs={**ceiling.inputs, "capped": winner.rule, "asked": winner.value})


def merge(layers: Iterable[Mapping[str, Decision]], knobs: Mapping[str, Knob]) -> dict[str, Decision]:
    """The winning, clamped decision per knob. ``layers`` may come in any order: the rank of each decision's
    layer decides, and among equal ranks the later mapping wins (a later hold over an earlier one); a
    :data:`CEILING_RULE` decision caps the winner instead (the lowest ceiling, :func:`capped`)."""
    winners: dict[str, Decision] = {}
    ceilings: dict[str, Decision] = {}
    for layer in layers:
        for knob_id, dec in layer.items():
            knob = knobs.get(knob_id)
            if knob is None:
                continue
            if dec.rule == CEILING_RULE:
                low = ceilings.get(knob_id)
                if low is None or (dec.value is not None and (low.value is None or dec.value < low.value)):
                    ceilings[knob_id] = dec
                continue
            cur = winners.get(knob_id)
            if cur is None or LAYER_RANK[dec.layer] <= LAYER_RANK[cur.layer]:
                winners[knob_id] = dec
    out: dict[str, Decision] = {}
    for k, d in winners.items():
        knob, v = knobs[k], d.value
        # the usual case inline: a value within the knob's bounds (and 0–100 % for a duty) with its request
        # set is what clamped() gives back unchanged
        if (v is None or d.requested is None or v != v or (knob.min is not None and not v >= knob.min)
                or (knob.max is not None and not v <= knob.max)
                or (knob.kind in DUTY_KINDS and not 0.0 <= v <= 100.0)):
            d = clamped(knob, d)
        out[k] = d
    for knob_id, ceiling in ceilings.items():
        dec = capped(knobs[knob_id], out.get(knob_id), ceiling)
        if dec is None:
            out.pop(knob_id, None)
        else:
            out[knob_id] = dec
    return out
