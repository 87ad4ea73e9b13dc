"""Running one compiled rule for one tick: power limits (GPU, RAPL PL1/PL2) and fans.

Every target's ``when`` is evaluated each tick (so ``sustain_s`` timers stay true to time), but a knob
already decided by an earlier rule of the same policy keeps that decision: the first matching rule wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aithermd.model import EMPTY, Decision, Layer, Status
from aithermd.policy import curves as fc
from aithermd.policy import efficient, memo, sources
from aithermd.policy.conditions import Ctx
from aithermd.policy.explain import Lazy
from aithermd.policy.plan import CRule, Target, power_value

_TEXT = MappingProxyType({"default": "the default", "min": "the minimum", "max": "the maximum"})


def _limit_text(spec: tuple[str, float], value: float, knob: Any = None) -> str:
    unit = knob.unit if knob is not None else "W"
    kind, number = spec
    if kind == "choice":
        return f"{knob.kind} {knob.choices[int(number)]}"
    if kind == "pct":
        of = "the top clock" if unit == "MHz" else "the default"
        return f"{number:g}% of {of} ({value:g} {unit})"
    if kind in _TEXT:
        if unit == "MHz" and kind == "max":
            return f"unlocked ({value:g} MHz)"
        if unit == "MHz" and kind == "min":
            return f"locked to the lowest clock ({value:g} MHz)"
        return f"{_TEXT[kind]} ({value:g} {unit})"
    return f"{value:g} {unit}"


def _temps(rule: CRule, inp: Any, ctx: Ctx) -> tuple[dict[str, float], float | None, dict[str, float],
                                                    dict[str, str], tuple[str, str] | None]:
    """Per leaf curve: its source temperature (:func:`aithermd.policy.sources.resolve`), smoothed over the
    curve's ``smoothing_s`` (its window of the resolved source), their max, the raw values of the smoothed
    ones, the channels each used, and the first failed required input (channel, status) of any leaf. A
    source that fails now has no temperature whatever its history: its fans go to full at once."""
    temps: dict[str, float] = {}
    raw: dict[str, float] = {}
    used: dict[str, str] = {}
    failed: tuple[str, str] | None = None
    for leaf, inputs in rule.inputs.items():
        res = sources.resolve(rule.agg.get(leaf, "max"), inputs, inp.readings)
        if res.value is None:
            failed = failed or res.failed
            continue
        temps[leaf] = res.value
        used[leaf] = ",".join(res.used)
        smooth = rule.smooth.get(leaf)
        if smooth is not None and smooth[0] in ctx.ok:
            mean = ctx.windows[smooth[0]].mean_upto(smooth[1], ctx.now)
            if mean is not None:
                raw[leaf] = temps[leaf]
                temps[leaf] = mean
    return temps, (max(temps.values()) if temps else None), raw, used, failed


TEMPS_KEY = "@temps|"  # a rule's sources by value, in its policy's memo (a rule name never starts with @)


def _temps_kept(rule: CRule, inp: Any, ctx: Ctx, prev_memo: Mapping[str, Any], memo_out: dict[str, Any]
                ) -> tuple[dict[str, float], float | None, dict[str, float], dict[str, str],
                           tuple[str, str] | None, Mapping[str, Any]]:
    """:func:`_temps` and the ``used:`` entries of the decisions' inputs, not worked out again while every
    reading the rule's sources read is equal (by value and status) to the last tick's: they are a function
    of those readings alone. A smoothed source reads a window, which moves with time: worked out every
    tick. Kept in the policy's memo under :data:`TEMPS_KEY` (the rule object compared by identity: a
    reload or a device change compiles a new one)."""
    if rule.smooth:
        temps, hottest, raw, used, failed = _temps(rule, inp, ctx)
        return temps, hottest, raw, used, failed, {f"used:{k}": v for k, v in used.items()}
    sig = tuple(map(inp.readings.get, rule.channels))  # no comprehension made per tick
    key = TEMPS_KEY + rule.memo_key
    kept = prev_memo.get(key)
    if kept is None or kept[0] is not rule or kept[1] != sig:
        temps, hottest, raw, used, failed = _temps(rule, inp, ctx)
        eager = {}
        for k, v in used.items():
            eager[f"used:{k}"] = v
        kept = (rule, sig, temps, hottest, raw, used, failed, eager)
    memo_out[key] = kept
    return kept[2], kept[3], kept[4], kept[5], kept[6], kept[7]


def _fan_value(rule: CRule, t: Target, ctx: Ctx, inp: Any, temps: dict[str, float], hottest: float | None,
               prev_curves: Mapping[str, fc.CurveState], out_curves: dict[str, fc.CurveState],
               keys: Mapping[str, str], shared: list[tuple[tuple[Any, ...], Any]] | None,
               before: tuple[fc.CurveState | None, ...], prev: fc.FanState
               ) -> tuple[float | None, float | None, bool, str]:
    """The duty (%) to send to ``t``'s fan (None: its curve has no temperature), the curve's own duty
    before shaping (None for a fixed duty), whether it is steady: the duty the fan already has, with
    no ramp holding it back (shaped without the ramp limits it is the same), and the ramp holding it back
    this tick, in words for the decision's reason (" (ramping down at 1 %/s, ramp_down_pct_s; the curve
    asks 28.8 %)"; "" when no ramp limited it). ``keys``: each curve's name →
    its key in the policy's curve states; ``shared``: the rule's curves worked out this tick by their
    previous states (the temperatures and the time are the rule's own this tick, so equal states give
    equal results: the fans of one rule that moved together are worked out once; None for a rule of one
    fan); ``before``: the previous curve states in ``keys``' order; ``prev``: the fan's last duty and time
    (the engine's memory, else as read back)."""
    model = rule.model
    curve_pct: float | None = None
    if model.duty_pct is not None:
        duty: float | None = model.duty_pct
    else:
        # another fan of this rule worked out the same curves from the same states
        done = None
        for states_before, result in shared or ():  # a tuple compares its items by identity first
            if states_before == before:
                done = result
                break
        if done is None:
            states = {}
            for n, st in zip(keys, before, strict=True):
                if st is not None:
                    states[n] = st
            new_states: dict[str, fc.CurveState] = {}
            duty = fc.evaluate(rule.curve_name, rule.curves[rule.curve_name], rule.curves, temps, ctx.now,
                               states, new_states) if rule.curve_name in rule.curves else None
            done = (duty, new_states)
            if shared is not None:
                shared.append((before, done))
        duty, new_states = done
        for n, v in new_states.items():
            out_curves[keys[n]] = v
        if duty is None:
            return None, None, False, ""
        curve_pct = duty
    low, start, stop = rule.fan_limits[t.knob.id]
    ramp_up, ramp_down = model.ramp_up_pct_s, model.ramp_down_pct_s
    value = fc.shape(duty, hottest, ctx.now, prev, min_duty_pct=low, start_duty_pct=start,
                     stop_below_c=model.stop_below_c, ramp_up_pct_s=ramp_up, ramp_down_pct_s=ramp_down,
                     stop_pct=stop, stop_hysteresis_pct=model.stop_hysteresis_pct)
    steady = value == prev.duty_pct and (
        (ramp_up is None and ramp_down is None)
        or fc.shape(duty, hottest, ctx.now, prev, min_duty_pct=low, start_duty_pct=start,
                    stop_below_c=model.stop_below_c, stop_pct=stop,
                    stop_hysteresis_pct=model.stop_hysteresis_pct) == value)
    ramping = ""
    last, then = prev.duty_pct, prev.t
    if last is not None and then is not None and ctx.now > then and value != last:
        # shape() gives back last ∓ rate × dt, computed alike, exactly when a ramp limited the step
        if ramp_down is not None and value == last - ramp_down * (ctx.now - then):
            ramping = f" (ramping down at {ramp_down:g} %/s, ramp_down_pct_s;"
        elif ramp_up is not None and value == last + ramp_up * (ctx.now - then):
            ramping = f" (ramping up at {ramp_up:g} %/s, ramp_up_pct_s;"
        if ramping:
            ramping += f" the {'curve' if curve_pct is not None else 'rule'} asks {duty:.1f} %)"
    return value, curve_pct, steady, ramping


def _fan_inputs(before: tuple[Mapping[str, Any], ...], temps: Mapping[str, float], raw: Mapping[str, float],
                used: Mapping[str, str], curve_pct: float | None) -> dict[str, Any]:
    """A fan decision's inputs, built when read (:mod:`aithermd.policy.explain`): the machines' and the
    rule's statistics and the earlier rules' progress (``before``), then per leaf curve its source
    temperature, its raw value where smoothed and the channels it used, then the curve's duty."""
    inputs: dict[str, Any] = {}
    for part in before:
        inputs.update(part)
    inputs.update({f"source:{k}": round(v, 2) for k, v in temps.items()})
    inputs.update({f"raw:{k}": round(v, 2) for k, v in raw.items()})
    inputs.update({f"used:{k}": v for k, v in used.items()})
    if curve_pct is not None:
        inputs["curve_pct"] = round(curve_pct, 2)
    return inputs


START_MARGIN_PCT = 5.0  # a start duty found once is not one forever (temperature, wear: FanControl #3855)
STOP_MARGIN_PCT = 2.0  # kept above the lowest duty the fan turned at, so it does not stall at the edge
UNCALIBRATED_START_PCT = 50.0  # an uncalibrated fan starting from standstill: above any 4-wire fan's start


def fan_limits(model: Any, knob: Any) -> tuple[float, float | None, float | None]:
    """``(min duty, start duty, stop duty)`` (%) of a fan rule's ``model`` for ``knob``: the rule's own
    ``min_duty_pct``/``start_duty_pct`` when it gives them, else the knob's calibration (its stop duty plus
    :data:`STOP_MARGIN_PCT` as the minimum, its start duty plus :data:`START_MARGIN_PCT` as the kick), else
    0 and :data:`UNCALIBRATED_START_PCT`. The stop duty (for the start/stop hysteresis) applies to a fan
    allowed to stop: a rule that
    says ``min_duty_pct: 0`` on a calibrated fan."""
    cal = knob.fan if knob.fan is not None and knob.fan.calibrated else None
    low = model.min_duty_pct if model.min_duty_pct is not None else (
        min(100.0, cal.stop_pct + STOP_MARGIN_PCT) if cal is not None and cal.stop_pct is not None else 0.0)
    known_start = cal is not None and cal.start_pct is not None
    start = model.start_duty_pct if model.start_duty_pct is not None else (
        min(100.0, cal.start_pct + START_MARGIN_PCT) if known_start  # type: ignore[union-attr]
        else UNCALIBRATED_START_PCT)
    stop = cal.stop_pct if cal is not None and model.min_duty_pct == 0 else None
    return low, start, stop


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
             decisions: dict[str, Decision], fan_sources: dict[str, tuple[str, ...]],
             fan_failed: dict[str, tuple[str, str]] | None = None,
             pending: dict[str, dict[str, Any]] | None = None, prev_memo: Mapping[str, memo.FanMemo] = EMPTY,
             memo_out: dict[str, memo.FanMemo] | None = None) -> None:
    """Decide the knobs ``rule`` targets (into ``decisions``, first rule wins); record fan curve sources
    (every channel a fan's curve may read) and, in ``fan_failed``, the fans whose source failed this tick
    with the first failed input (channel, status). ``pending``: knob id → the ``{"elapsed_s", "need_s"}``
    progress of earlier rules that did not hold yet (``"<rule>: <condition>"``), added to the inputs of
    the rule that decides the knob."""
    pending = {} if pending is None else pending
    memo_out = {} if memo_out is None else memo_out
    temps: dict[str, float] | None = None
    hottest: float | None = None
    raw: dict[str, float] = {}
    used: dict[str, str] = {}
    eager: Mapping[str, Any] = EMPTY
    failed: tuple[str, str] | None = None
    shared: list[tuple[tuple[Any, ...], Any]] | None = [] if len(rule.targets) > 1 else None
    for t in rule.targets:
        ctx.scope = t.scope
        ctx.stats = {}
        holds = rule.when.eval(ctx) if rule.when is not None else True
        if t.knob.id in decisions:
            continue
        if holds is not True:  # its timers and windows still filling: shown with whatever decides the knob
            waiting = {f"{rule.name}: {k}": v for k, v in ctx.stats.items() if isinstance(v, dict)}
            if waiting:
                pending.setdefault(t.knob.id, {}).update(waiting)
            continue
        before = (machine_stats.get(t.scope, EMPTY), ctx.stats, pending.get(t.knob.id, EMPTY))
        if rule.kind == "fan":
            if temps is None:
                temps, hottest, raw, used, failed, eager = _temps_kept(rule, inp, ctx, prev_memo, memo_out)
            if rule.curve_name is not None:
                fan_sources[t.knob.id] = rule.channels
                if failed is not None and fan_failed is not None:
                    fan_failed[t.knob.id] = failed
            key, keys = rule.memo_keys[t.knob.id], rule.curve_keys[t.knob.id]
            prev = fans.get(t.knob.id)
            if prev is None:
                kv = inp.knobs.get(t.knob.id)
                prev = fc.FanState(kv.value if kv is not None and kv.status == Status.OK else None, None)
            last = prev.duty_pct  # memo.last_duty
            prior = tuple(map(prev_curves.get, keys.values()))
            kept = prev_memo.get(key)
            if kept is not None and memo.reuse(kept, rule, layer, policy, temps, raw, used, prior,
                                               last):  # no work for unchanged inputs (memo.py)
                if kept.before != before:  # only the explanation moved: the duty and curves kept
                    kept = memo.explained(kept, before, Lazy(_fan_inputs, before, temps, raw, used,
                                                             kept.curve_pct, eager=eager))
                decisions[t.knob.id] = kept.decision
                for ck, st in kept.out:  # memo.carry(), inline: a PID's state with this tick's time
                    out_curves[ck] = st if st.t is None else fc.CurveState(st.ref_c, st.integral, st.prev_err,
                                                                          ctx.now)
                memo_out[key] = kept
                continue
            value, curve_pct, steady, ramping = _fan_value(rule, t, ctx, inp, temps, hottest, prev_curves,
                                                           out_curves, keys, shared, prior, prev)
            if value is None:
                continue
            inputs: Mapping[str, Any] = Lazy(_fan_inputs, before, temps, raw, used, curve_pct, eager=eager)
            what = 'curve ' + rule.curve_name if rule.curve_name else 'fixed duty'
            reason = f"{what} → {value:.0f} %{ramping}"
            states = memo.bare_all(prior) if steady else ()
            carried = memo.left(rule, keys, states, out_curves, ctx.now) if steady else None
            if carried is not None:
                dec = Decision(knob_id=t.knob.id, value=t.knob.clamp(value), layer=layer,
                               rule=f"{policy}/{rule.name}", reason=reason, requested=value, inputs=inputs)
                decisions[t.knob.id] = dec
                memo_out[key] = memo.FanMemo(rule, layer, policy, temps, raw, used, before, states, last, dec,
                                             carried, curve_pct)
                continue
        else:
            inputs = {**before[0], **before[1], **before[2]}
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
                text = _limit_text(t.value, value, t.knob)
            reason = f"{target}{' in ' + where if where else ''}: {text}"
        decisions[t.knob.id] = Decision(knob_id=t.knob.id, value=t.knob.clamp(value), layer=layer,
                                        rule=f"{policy}/{rule.name}", reason=reason, requested=value,
                                        inputs=inputs)
