"""Quiet mode: noise ceilings met by lowering power first. An engine stage over one policy's decisions; pure.

:func:`compile_quiet` resolves each ``quiet`` block once per (policy, devices): for each fan of a ceiling
group, the fan rule that drives it (the first that targets it), the temperature at which that rule's curve
would pass the ceiling (:func:`ceiling_c`: the points curve inverted, a PID's proportional answer, the
lowest of a ``max`` mix's), the curve's source channels, the temperature at which the safety layer would
act on each (less ``danger_margin_c``), and the *heat sources* whose power limits warm those channels:
a GPU's own ``power_limit`` for its temperatures and fans; the RAPL packages' PL1/PL2 for a CPU chip
(coretemp, k10temp, zenpower); every GPU and package for anything else (case and board sensors).

Each tick :func:`apply` takes the first block whose ``when`` holds and, for each fan:

- its *pressure*: how far its source temperature (the mean of :data:`SMOOTH_S` s) has come into the band
  ``approach_c`` below the ceiling temperature, 0 below the band and 1 at the ceiling;
- each heat source's *factor* moves toward 1 − pressure × (1 − ``min_limit_pct``/100) by at most
  ``ramp_pct_s`` per second, and its limit is the factor × what the policy asks (never below the knob's
  minimum): a proportional band, so the temperature settles inside it while the fans hold their ceiling.
  What the policy asks is clamped to the knob first: a RAPL PL1 at firmware's "unlimited" 4090 W over a
  95 W maximum has its band on 95 W, and quiet keeps it there for :data:`HANDBACK_S` after its last
  pressure instead of handing 4090 W back each time the band lets go (attack5 C6: PL1 flapped 4090 ↔ 95 W
  19 times in 34 s, the package swinging 300 ↔ 95 W);
- the fan's duty is held at the ceiling (never below its rule's minimum duty, ``min_duty_pct`` or the
  calibrated stop duty plus a margin) unless every heat source it has has been at its lowest factor for
  :data:`SETTLE_S` (the heat needs that long to answer) and the temperature has reached the ceiling
  temperature anyway (*exhausted*), or a source is within
  ``danger_margin_c`` of its safety threshold (*danger*): then the curve's own value stands, until every
  source has read :data:`DANGER_HYST_C` under its danger line for :data:`DANGER_HOLD_S` (a stop/start is the
  loudest thing a fan does: a fixed duty under a 0 % ceiling stopped and restarted its fans 145 times in 30
  minutes on a per-tick escape, attack5 C2; now at most 3600 / DANGER_HOLD_S = 12 starts an hour). The
  built-in safety layer is applied after this and overrides it.

With ``gpu_target_temp_c``, every GPU whose driver exposes NVML's acoustic threshold (the GPU Target
Temperature) gets it while the block holds, clamped to the driver's range: the GPU's own boost then holds it
cooler, one more knob beside the power limit; it is handed back when quiet ends.

A fan whose rule reads no temperature (a fixed ``duty_pct``) has no pressure: it is held at its ceiling until
any temperature the safety layer watches (every GPU, CPU and board sensor with a threshold) comes within
``danger_margin_c`` of its trigger, and its heat sources are every GPU's and package's limits.

A ``max_rpm`` ceiling is turned into a duty each tick from the fan's own tachometer (duty × max_rpm / RPM,
averaged): fans are close to linear in duty above their stall point. A fan no fan rule drives (firmware
control) cannot be held to a ceiling; its group still lowers power through its other fans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aithermd.model import Decision, Device, DeviceKind, Knob, KnobKind, Layer, Status
from aithermd.policy import safety, selectors, sources
from aithermd.policy.kinds import MixCurve, PidCurve, PointsCurve

SMOOTH_S = 10.0  # the source temperature quiet reads: its time-weighted mean over this long
DANGER_HYST_C = 5.0  # a danger escape ends only once every source reads this far under its danger line
DANGER_HOLD_S = 300.0  # ... for this long: each escape lasts at least this (≤ 12 fan starts an hour)
SETTLE_S = 30.0  # a limit must have been at its lowest this long before the heat counts as beyond it
HANDBACK_S = 300.0  # a limit asked above its maximum is handed back this long after its last pressure
RPM_GAIN = 0.3  # how far an RPM ceiling's duty moves toward its new estimate each tick
EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class QFan:
    knob: Knob
    ceiling_pct: float | None  # max_duty_pct, or None for an RPM ceiling
    max_rpm: float | None
    rule: Any  # the plan's CRule driving it, or None
    sources: tuple[tuple[str, str, Any], ...]  # (leaf curve, window key, curve) with a source
    danger_c: tuple[tuple[str, float], ...]  # (channel id, temperature at which the fan may pass)
    heat: tuple[Knob, ...]  # the power knobs that warm its sources
    floor_pct: float = 0.0  # its rule's minimum duty (rules.fan_limits): no ceiling holds it lower


@dataclass(frozen=True)
class CQuiet:
    spec: Any
    when: Any
    fans: tuple[QFan, ...]
    targets: tuple[Knob, ...] = ()  # the GPUs' acoustic thresholds, set when gpu_target_temp_c is given


@dataclass(frozen=True)
class QuietState:
    """Per power knob the factor on its limit (1 = untouched), the limit found before quiet first set it and
    since when its factor has been at its lowest; per RPM-limited fan its duty ceiling (%); ``t`` the last
    tick's time."""

    factors: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    found: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    caps: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    t: float | None = None
    low_since: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    pressed: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # power knob asked above its
    # maximum → when quiet last pressed it
    escaped: Mapping[str, tuple[str, float | None]] = field(default_factory=lambda: EMPTY)  # fan → (the
    # channel that was in danger, since when every source has read DANGER_HYST_C under its line; None: not)


def ceiling_c(curve: Any, curves: Mapping[str, Any], duty_pct: float, depth: int = 0) -> float:
    """The lowest temperature (°C) at which ``curve`` asks for more than ``duty_pct``; +inf when it never
    does (−inf when it always does)."""
    if depth > 32:
        return math.inf
    if isinstance(curve, PointsCurve):
        pts = curve.points
        if pts[0][1] > duty_pct:
            return -math.inf
        for (t0, d0), (t1, d1) in zip(pts, pts[1:], strict=False):
            if d1 > duty_pct >= d0:
                return t0 + (t1 - t0) * (duty_pct - d0) / (d1 - d0)
        return math.inf
    if isinstance(curve, PidCurve):
        return curve.setpoint_c + ((duty_pct - curve.base_pct) / curve.kp if curve.kp > 0 else 0.0)
    if isinstance(curve, MixCurve):
        temps = [ceiling_c(curves[n], curves, duty_pct, depth + 1) for n in curve.curves if n in curves]
        if not temps:
            return math.inf
        return max(temps) if curve.fn == "min" else min(temps)
    return math.inf


def _heat_sources(channel_ids: Sequence[str], fan: Knob, devices: Sequence[Device]) -> tuple[Knob, ...]:
    by_id = {d.id: d for d in devices}
    power = (KnobKind.POWER_LIMIT, KnobKind.PL1, KnobKind.PL2)
    gpus = [k for d in devices if d.kind == DeviceKind.GPU for k in d.knobs if k.kind == KnobKind.POWER_LIMIT]
    packages = [k for d in devices if d.kind == DeviceKind.POWERCAP
                and selectors.zone_name(d).startswith("package") for k in d.knobs if k.kind in power]
    out: dict[str, Knob] = {}
    owner = by_id.get(fan.device_id)
    if owner is not None and owner.kind == DeviceKind.GPU:
        out.update({k.id: k for k in owner.knobs if k.kind == KnobKind.POWER_LIMIT})
    for cid in channel_ids:
        dev = by_id.get(cid.rsplit("/", 1)[0])
        if dev is None:
            continue
        if dev.kind == DeviceKind.GPU:
            out.update({k.id: k for k in dev.knobs if k.kind == KnobKind.POWER_LIMIT})
        elif dev.chip and dev.chip.startswith(safety.CPU_CHIPS):
            out.update({k.id: k for k in packages})
        else:
            out.update({k.id: k for k in (*gpus, *packages)})
    return tuple(out.values())


def compile_quiet(doc: Any, comp: Any, devices: Sequence[Device], rules: Sequence[Any]) -> tuple[CQuiet, ...]:
    """Each ``quiet`` block of ``doc`` for ``devices`` (``rules``: the plan's compiled rules); registers the
    source windows it reads in ``comp.needs``."""
    from aithermd.policy.rules import fan_limits  # rules → memo → plan → quiet: not at import time

    blocks = doc.quiet if isinstance(doc.quiet, list) else [doc.quiet] if doc.quiet is not None else []
    channels = selectors.channel_map(devices)
    by_id = {d.id: d for d in devices}
    watched = [cid for cid, _ in safety.plan(devices, safety.SafetyParams(doc.safety.margin_c)).triggers]
    out = []
    for i, spec in enumerate(blocks):
        key = f"quiet[{i}]" if isinstance(doc.quiet, list) else "quiet"
        when = comp.compile(spec.when, f"{key}.when")
        fans: dict[str, QFan] = {}
        for group in spec.fans:
            for knob in selectors.select_fans(group.fans, devices):
                if knob.id in fans:
                    continue
                rule = next((r for r in rules if r.kind == "fan" and any(t.knob.id == knob.id for t in r.targets)),
                            None)
                found, chans = [], []
                for leaf, ids in (rule.sources.items() if rule is not None else ()):
                    if not ids:
                        continue
                    wkey = sources.key(rule.agg.get(leaf, "max"), rule.inputs.get(leaf, ()))
                    comp.needs[wkey] = max(comp.needs.get(wkey, 0.0), SMOOTH_S)
                    found.append((leaf, wkey, rule.curves.get(leaf)))
                    chans += ids
                if not chans:  # a fixed duty reads no temperature: every one the safety layer watches may
                    chans = list(watched)  # need this fan, and the danger escape reads them all
                danger = []
                for cid in dict.fromkeys(chans):
                    ch, dev = channels.get(cid), by_id.get(cid.rsplit("/", 1)[0])
                    trig = None if ch is None or dev is None else \
                        safety.trigger_c(dev, ch.thresholds, safety.SafetyParams(doc.safety.margin_c))
                    if trig is not None:
                        danger.append((cid, trig - spec.danger_margin_c))
                floor = fan_limits(rule.model, knob)[0] if rule is not None else 0.0
                fans[knob.id] = QFan(knob, group.max_duty_pct, group.max_rpm, rule, tuple(found),
                                     tuple(danger), _heat_sources(chans, knob, devices), floor)
        targets = tuple(k for d in devices if d.kind == DeviceKind.GPU for k in d.knobs
                        if k.kind == KnobKind.TARGET_TEMPERATURE) if spec.gpu_target_temp_c is not None else ()
        out.append(CQuiet(spec, when, tuple(fans.values()), targets))
    return tuple(out)


def choose(blocks: Sequence[CQuiet], ctx: Any) -> CQuiet | None:
    for b in blocks:
        ctx.scope, ctx.stats = None, {}
        if b.when is None or b.when.eval(ctx) is True:
            return b
    return None


def _ok(readings: Mapping[str, Any], cid: str) -> float | None:
    r = readings.get(cid)
    if r is None or r.status != Status.OK or r.value is None or not math.isfinite(r.value):
        return None
    return float(r.value)


def _duty_ceiling(f: QFan, inp: Any, caps: Mapping[str, float], new_caps: dict[str, float]) -> float:
    if f.ceiling_pct is not None:
        return f.ceiling_pct
    prev = caps.get(f.knob.id, 100.0)
    kv = inp.knobs.get(f.knob.id)
    rpm = _ok(inp.readings, f.knob.fan_channel) if f.knob.fan_channel else None
    duty = kv.value if kv is not None and kv.status == Status.OK else None
    cap = prev
    if rpm and duty and rpm > 0 and duty > 0:
        cap = prev + RPM_GAIN * (min(100.0, duty * f.max_rpm / rpm) - prev)  # type: ignore[operator]
    new_caps[f.knob.id] = cap
    return cap


def _pressure(f: QFan, ceiling: float, ctx: Any, approach_c: float) -> tuple[float, float | None, float]:
    """(pressure 0–1+, hottest smoothed source temperature, its ceiling temperature)."""
    best, temp, t_ceil = 0.0, None, math.inf
    for _leaf, wkey, curve in f.sources:
        w = ctx.windows.get(wkey)
        t = w.mean_upto(SMOOTH_S, ctx.now) if w is not None and wkey in ctx.ok else None
        if t is None or curve is None:
            continue
        tc = ceiling_c(curve, f.rule.curves, ceiling)
        p = (t - (tc - approach_c)) / approach_c if math.isfinite(tc) else (1.0 if tc < 0 else 0.0)
        if temp is None or p > best:
            best, temp, t_ceil = max(best, p), t, tc
    return best, temp, t_ceil


def apply(cq: CQuiet, policy: str, layer: Layer, decisions: dict[str, Decision], ctx: Any, inp: Any,
          prev: QuietState | None) -> QuietState:
    """Hold the fans of ``cq`` to their ceilings and lower the heat sources' limits in ``decisions`` (this
    policy's, changed in place). Returns the new state."""
    prev = prev or QuietState()
    spec = cq.spec
    dt = ctx.now - prev.t if prev.t is not None and ctx.now > prev.t else 0.0
    low = spec.min_limit_pct / 100.0
    new_caps: dict[str, float] = {}
    pressure: dict[str, float] = {}
    fan_info: dict[str, tuple[QFan, float, float, float | None, float]] = {}
    for f in cq.fans:
        ceiling = max(_duty_ceiling(f, inp, prev.caps, new_caps), f.floor_pct)
        p, temp, t_ceil = _pressure(f, ceiling, ctx, spec.approach_c)
        fan_info[f.knob.id] = (f, ceiling, p, temp, t_ceil)
        for k in f.heat:
            pressure[k.id] = max(pressure.get(k.id, 0.0), p)
    factors: dict[str, float] = {}
    low_since: dict[str, float] = {}
    found = dict(prev.found)
    step = spec.ramp_pct_s / 100.0 * dt
    heat = {k.id: k for f in cq.fans for k in f.heat}
    pressed: dict[str, float] = {}
    for kid, knob in heat.items():
        target = 1.0 - min(1.0, max(0.0, pressure.get(kid, 0.0))) * (1.0 - low)
        f0 = prev.factors.get(kid, 1.0)
        fac = min(f0 + step, target) if target > f0 else max(f0 - step, target)
        factors[kid] = fac
        if fac <= low + 1e-6:
            low_since[kid] = prev.low_since.get(kid, ctx.now)
        dec = decisions.get(kid)
        kv = inp.knobs.get(kid)
        if kid not in found and kv is not None and kv.status == Status.OK and kv.value:
            found[kid] = float(kv.value)
        ask = dec.value if dec is not None and dec.value is not None else found.get(kid)
        if ask is None:
            continue
        base = knob.clamp(ask)  # the band is on what the knob can hold (module doc)
        if fac < 1.0 - 1e-9:
            if base != ask:
                pressed[kid] = ctx.now
        elif base == ask or ctx.now - prev.pressed.get(kid, -math.inf) >= HANDBACK_S:
            continue
        else:
            pressed[kid] = prev.pressed[kid]
        value = knob.clamp(max(base * fac, knob.min or 0.0))
        inputs = {**(dec.inputs if dec is not None else {}), "quiet_factor": round(fac, 3),
                  "quiet_pressure": round(pressure.get(kid, 0.0), 3)}
        reason = (f"quiet: fans near their ceiling, {kid} at {fac:.0%} of {base:.0f} W"
                  + (f" (its maximum; {ask:.0f} W asked)" if base != ask else "")
                  + (f" (asked by {dec.rule})" if dec is not None else ""))
        decisions[kid] = Decision(knob_id=kid, value=value, layer=dec.layer if dec is not None else layer,
                                  rule=f"{policy}/quiet", reason=reason, requested=base * fac, inputs=inputs)
    for knob in cq.targets:  # NVML's acoustic threshold: the GPU's boost holds it cooler, its fans do less
        value = knob.clamp(spec.gpu_target_temp_c)
        decisions[knob.id] = Decision(knob.id, value, layer, f"{policy}/quiet",
                                      f"quiet: {knob.device_id} target temperature {value:g} °C (NVML acoustic "
                                      "threshold)", spec.gpu_target_temp_c, {})
    escaped: dict[str, tuple[str, float | None]] = {}
    for kid, (f, ceiling, p, temp, t_ceil) in fan_info.items():
        dec = decisions.get(kid)
        if dec is None or dec.value is None or dec.value <= ceiling:
            continue
        exhausted = bool(f.heat) and p >= 1.0 and all(
            ctx.now - low_since.get(k.id, ctx.now) >= SETTLE_S for k in f.heat)
        no_heat = not f.heat and p >= 1.0
        danger, lately = _danger(f, inp.readings, 0.0), False
        if danger is not None:
            escaped[kid] = (danger, None)
        elif (was := prev.escaped.get(kid)) is not None:  # escaped: it ends DANGER_HOLD_S after it cooled
            near = _danger(f, inp.readings, DANGER_HYST_C)
            clear = None if near is not None else ctx.now if was[1] is None else was[1]
            if clear is None or ctx.now - clear < DANGER_HOLD_S:
                escaped[kid], danger, lately = (near or was[0], clear), near or was[0], True
        inputs = {**dec.inputs, "quiet_ceiling_pct": round(ceiling, 1)}
        if temp is not None:
            inputs["quiet_source_c"], inputs["quiet_ceiling_c"] = round(temp, 1), round(t_ceil, 1)
        if danger is not None or exhausted or no_heat:
            why = (f"{danger} within {spec.danger_margin_c:g} °C of its safety threshold" if danger
                   else "power limits at their lowest and the temperature at the ceiling")
            if lately:
                why += (f" lately (held until every source is {DANGER_HYST_C:g} °C under for "
                        f"{DANGER_HOLD_S:g} s)")
            decisions[kid] = Decision(kid, dec.value, dec.layer, dec.rule,
                                      f"{dec.reason}; above its {ceiling:.0f} % quiet ceiling: {why}",
                                      dec.requested, inputs)
            continue
        decisions[kid] = Decision(kid, f.knob.clamp(ceiling), dec.layer, f"{policy}/quiet",
                                  (f"quiet ceiling {f.ceiling_pct:g} %, held at the rule's minimum duty "
                                   f"{f.floor_pct:g} % (the curve asks {dec.value:.0f} %)"
                                   if f.ceiling_pct is not None and f.ceiling_pct < f.floor_pct else
                                   f"quiet ceiling {ceiling:.0f} % (the curve asks {dec.value:.0f} %)"),
                                  dec.value, inputs)
    return QuietState(MappingProxyType(factors), MappingProxyType(found), MappingProxyType(new_caps), ctx.now,
                      MappingProxyType(low_since), MappingProxyType(pressed), MappingProxyType(escaped))


def _danger(f: QFan, readings: Mapping[str, Any], under_c: float) -> str | None:
    """The first source of ``f`` reading within ``under_c`` of its danger line or over it, or None."""
    return next((cid for cid, at in f.danger_c
                 if (v := _ok(readings, cid)) is not None and v >= at - under_c), None)
