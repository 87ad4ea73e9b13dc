"""Running one compiled rule for one tick: power limits (GPU, RAPL PL1/PL2) and fans.

Every target's ``when`` is evaluated each tick (so ``sustain_s`` timers stay true to time), but a knob
already decided by an earlier rule of the same policy keeps that decision: the first matching rule wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aithermd.model import Decision, Layer, Status
from aithermd.policy import curves as fc
from aithermd.policy import efficient
from aithermd.policy.conditions import Ctx
from aithermd.policy.plan import CRule, Target, power_value

_TEXT = MappingProxyType({"default": "the default", "min": "the minimum", "max": "the maximum"})


def _limit_text(spec: tuple[str, float], watts: float) -> str:
    kind, number = spec
    if kind == "pct":
        return f"{number:g}% of the default ({watts:g} W)"
    if kind in _TEXT:
        return f"{_TEXT[kind]} ({watts:g} W)"
    return f"{watts:g} W"


def _temps(rule: CRule, inp: Any, ctx: Ctx) -> tuple[dict[str, float], float | None, dict[str, float]]:
    """Source temperature per leaf curve (only when every source reads ok this tick), smoothed over the
    curve's ``smoothing_s`` (its window of the aggregated source), their max, and the raw values of the
    smoothed ones. A source that fails now is absent whatever its history: its fans go to full at once."""
    temps: dict[str, float] = {}
    raw: dict[str, float] = {}
    for leaf, chans in rule.sources.items():
        values = []
        for c in chans:
            r = inp.readings.get(c)
            if r is None or r.status != Status.OK or r.value is None or not math.isfinite(r.value):
                values = []
                break
            values.append(float(r.value))
        if not values:
            continue
        fn = rule.agg.get(leaf, "max")
        temps[leaf] = (max(values) if fn == "max" else min(values) if fn == "min"
                       else sum(values) / len(values))
        smooth = rule.smooth.get(leaf)
        if smooth is not None and smooth[0] in ctx.ok:
            mean = ctx.windows[smooth[0]].mean_upto(smooth[1], ctx.now)
            if mean is not None:
                raw[leaf] = temps[leaf]
                temps[leaf] = mean
    return temps, (max(temps.values()) if temps else None), raw


def _fan_value(rule: CRule, t: Target, ctx: Ctx, inp: Any, temps: dict[str, float], hottest: float | None,
               raw: dict[str, float], prev_curves: Mapping[str, fc.CurveState],
               out_curves: dict[str, fc.CurveState],
               fans: Mapping[str, fc.FanState]) -> tuple[float | None, dict[str, Any]]:
    model = rule.model
    inputs: dict[str, Any] = {f"source:{k}": round(v, 2) for k, v in temps.items()}
    inputs.update({f"raw:{k}": round(v, 2) for k, v in raw.items()})
    if model.duty_pct is not None:
        duty: float | None = model.duty_pct
    else:
        prefix = f"{rule.name}|{t.knob.id}|"
        states = {k[len(prefix):]: v for k, v in prev_curves.items() if k.startswith(prefix)}
        new_states: dict[str, fc.CurveState] = {}
        duty = fc.evaluate(rule.curve_name, rule.curves[rule.curve_name], rule.curves, temps, ctx.now,
                           states, new_states) if rule.curve_name in rule.curves else None
        for k, v in new_states.items():
            out_curves[prefix + k] = v
        if duty is None:
            return None, inputs
        inputs["curve_pct"] = round(duty, 2)
    prev = fans.get(t.knob.id)
    if prev is None:
        kv = inp.knobs.get(t.knob.id)
        prev = fc.FanState(kv.value if kv is not None and kv.status == Status.OK else None, None)
    value = fc.shape(duty, hottest, ctx.now, prev, min_duty_pct=model.min_duty_pct,
                     start_duty_pct=model.start_duty_pct, stop_below_c=model.stop_below_c,
                     ramp_up_pct_s=model.ramp_up_pct_s, ramp_down_pct_s=model.ramp_down_pct_s)
    return value, inputs


def _search(rule: CRule, t: Target, ctx: Ctx, inp: Any, gpu: str) -> tuple[float, str, dict] | None:
    """One tick of the efficient-limit search for ``t``: (limit W, reason, inputs), or None when it cannot
    start (no default limit, no readable signal): the knob is then left to the next rule."""
    key = f"{rule.name}|{t.knob.id}"
    prev = ctx.searches.get(key)
    if prev is None:
        if t.knob.default is None:
            return None
        state = efficient.start(rule.search, gpu, ctx.now, t.knob.default, inp.readings)
        if state is None:
            return None
    else:
        kv = inp.knobs.get(t.knob.id)
        applied = kv.value if kv is not None and kv.status == Status.OK else None
        state = efficient.step(rule.search, prev, gpu, ctx.now, inp.readings, inp.attrs.get(gpu, {}),
                               t.knob.min, applied)
    ctx.searches_new[key] = state
    text, extra = efficient.explain(state, rule.search)
    return state.limit, text, extra


def run_rule(rule: CRule, ctx: Ctx, policy: str, layer: Layer, inp: Any,
             machine_stats: Mapping[str | None, Mapping[str, Any]], prev_curves: Mapping[str, fc.CurveState],
             out_curves: dict[str, fc.CurveState], fans: Mapping[str, fc.FanState],
             decisions: dict[str, Decision], fan_sources: dict[str, tuple[str, ...]]) -> None:
    """Decide the knobs ``rule`` targets (into ``decisions``, first rule wins); record fan curve sources."""
    temps: dict[str, float] | None = None
    hottest: float | None = None
    raw: dict[str, float] = {}
    for t in rule.targets:
        ctx.scope = t.scope
        ctx.stats = {}
        holds = rule.when.eval(ctx) if rule.when is not None else True
        if holds is not True or t.knob.id in decisions:
            continue
        inputs: dict[str, Any] = {**machine_stats.get(t.scope, {}), **ctx.stats}
        if rule.kind == "fan":
            if rule.curve_name is not None:
                fan_sources[t.knob.id] = tuple(c for chans in rule.sources.values() for c in chans)
            if temps is None:
                temps, hottest, raw = _temps(rule, inp, ctx)
            value, extra = _fan_value(rule, t, ctx, inp, temps, hottest, raw, prev_curves, out_curves, fans)
            inputs.update(extra)
            if value is None:
                continue
            what = f"curve {rule.curve_name}" if rule.curve_name else "fixed duty"
            reason = f"{what} → {value:.0f} %"
        else:
            target = t.scope or t.knob.device_id
            where = ", ".join(f"{k[6:]}.{v}" for k, v in inputs.items() if k.startswith("state:"))
            if rule.search is not None:
                found = _search(rule, t, ctx, inp, target)
                if found is None:
                    continue
                value, text, extra = found
                inputs.update(extra)
            else:
                value = power_value(t.knob, t.value)
                if value is None:
                    continue
                text = _limit_text(t.value, value)
            reason = f"{target}{' in ' + where if where else ''}: {text}"
        decisions[t.knob.id] = Decision(knob_id=t.knob.id, value=t.knob.clamp(value), layer=layer,
                                        rule=f"{policy}/{rule.name}", reason=reason, requested=value,
                                        inputs=inputs)
