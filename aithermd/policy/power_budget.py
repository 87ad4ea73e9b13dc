"""The node power budget as an engine stage: which devices share it, what each asks, and the decisions that
keep the limits in force within it. Pure; the arithmetic is :mod:`aithermd.policy.split`'s.

Once per (policy, devices) :func:`compile_budgets` resolves each ``budget`` block: the budget for the
devices in W DC (:func:`devices_budget_w`: ``wall_w`` × PSU efficiency, at most ``psu_rated_w``, less
``other_w``; or ``devices_w``), the GPUs' ``power_limit`` knobs and the CPU packages' RAPL PL1/PL2, and the
windows it reads (each GPU's ``power`` and ``utilization``, each package's ``power`` and ``cpu/utilization``
over ``window_s``).

Each tick, after arbitration, :func:`apply` takes the winning decisions and:

- a GPU's *ask* is what its policy or hold decided (after quiet mode), else the limit found when the budget
  first saw it; a knob the safety layer or an operator override decides, or one that cannot be written, is
  *fixed*: charged at the limit in force (or its new value, if higher), never changed by the budget;
- a CPU package is charged at the larger of its PL1 and PL2 — the short-term limit is what it may draw
  for PL2's time window, so a spike above PL1 is inside the budget (the time window itself is in
  ``Device.info``); it is given PL2 = its share and PL1 = the lesser of its ask and that share;
- a GPU is charged at the larger of its power limit and the enforced limit NVML reports (a board or
  driver limit above ours counts). Transients shorter than the driver's averaging window (GPU boost
  excursions of milliseconds) are not exposed by NVML or the amdgpu/xe hwmon ABI and are not counted:
  ``other_w`` and the PSU's own rating have to cover them;
- draw and utilization are their mean over ``window_s``, or the last reading when it jumped well above
  that mean: an arriving job is seen at once, a finished one once the window forgot it; a device is busy
  when its utilization reaches ``idle_below_pct``;
- the split (:func:`aithermd.policy.split.split`) and the grant (:func:`~aithermd.policy.split.grant`)
  decide each knob's value; every decision says in ``reason`` and ``inputs`` how the budget was split.

The stage's report (``EngineResult.budget``) goes into the snapshot for ``explain``, metrics and the
simulator's summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aithermd.model import Decision, Device, DeviceKind, Knob, KnobKind, KnobValue, Layer, Status
from aithermd.policy import selectors, split
from aithermd.policy.kinds import Budget

BUDGET_RULE = "budget"
JUMP = 1.25  # a last reading this far above the window's mean is a new load, not noise


@dataclass(frozen=True)
class Package:
    device_id: str
    pl1: Knob | None
    pl2: Knob | None
    power_key: str


@dataclass(frozen=True)
class CBudget:
    """One compiled ``budget`` block (see the module doc)."""

    spec: Budget
    when: Any  # a conditions.Node or None
    devices_w: float
    how: str
    gpus: tuple[tuple[str, Knob], ...]
    others: tuple[tuple[str, Knob], ...]  # GPUs outside the selector: charged, never written
    packages: tuple[Package, ...]


@dataclass(frozen=True)
class BudgetState:
    """What the budget remembers: the limit it found on each knob before it first decided it (W), and the
    devices its limit held back last tick."""

    found: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    bound: frozenset[str] = frozenset()


def _efficiency(spec: Budget, dc_w: float) -> float:
    eff = spec.psu_efficiency
    if not isinstance(eff, list):
        return float(eff)
    rated = spec.psu_rated_w or 1.0
    load = 100.0 * dc_w / rated
    points = sorted(eff)
    here = points[0][1] if load <= points[0][0] else points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= load <= x1:
            here = y0 + (y1 - y0) * (load - x0) / (x1 - x0)
            break
    # the lowest efficiency from this load up: the budget must hold however high the load goes
    return min([here] + [y for x, y in points if x > load])


def devices_budget_w(spec: Budget) -> tuple[float, str]:
    """(W DC for the GPUs and CPU packages, how it was worked out) for a ``budget`` block."""
    if spec.devices_w is not None:
        return spec.devices_w, f"{spec.devices_w:g} W for the GPUs and CPU packages"
    wall = float(spec.wall_w or 0.0)
    lo, hi = 0.0, wall
    for _ in range(60):  # the most DC power whose input stays within the wall budget
        mid = (lo + hi) / 2.0
        if mid / _efficiency(spec, mid) <= wall:
            lo = mid
        else:
            hi = mid
    dc = lo
    eff = _efficiency(spec, dc)
    how = f"{wall:g} W at the wall × {eff:.3g} efficiency"
    if spec.psu_rated_w is not None and spec.psu_rated_w < dc:
        dc = spec.psu_rated_w
        how = f"the PSU's {spec.psu_rated_w:g} W rating (below {wall:g} W at the wall × {eff:.3g})"
    total = max(0.0, dc - spec.other_w)
    return total, f"{how} − {spec.other_w:g} W for the rest of the machine = {total:.0f} W"


def compile_budgets(doc: Any, comp: Any, devices: Sequence[Device]) -> tuple[CBudget, ...]:
    """Each ``budget`` block of ``doc`` for ``devices``; registers the windows it reads in ``comp.needs``."""
    blocks = doc.budget if isinstance(doc.budget, list) else [doc.budget] if doc.budget is not None else []
    out = []
    for i, spec in enumerate(blocks):
        key = f"budget[{i}]" if isinstance(doc.budget, list) else "budget"
        when = comp.compile(spec.when, f"{key}.when")
        chosen = {d.id for d in selectors.select_gpus(spec.gpus, devices)}
        gpus, others = [], []
        for d in selectors.gpus(devices):
            knob = selectors.knob_of(d, KnobKind.POWER_LIMIT)
            if knob is not None:
                (gpus if d.id in chosen else others).append((d.id, knob))
        for dev, _ in gpus:
            for attr in ("power", "utilization"):
                comp.needs[f"{dev}/{attr}"] = max(comp.needs.get(f"{dev}/{attr}", 0.0), spec.window_s)
        packages = []
        for d in devices:
            if d.kind != DeviceKind.POWERCAP or not selectors.zone_name(d).startswith("package"):
                continue
            pl1 = next((k for k in d.knobs if k.kind == KnobKind.PL1), None)
            pl2 = next((k for k in d.knobs if k.kind == KnobKind.PL2), None)
            packages.append(Package(d.id, pl1, pl2, f"{d.id}/power"))
            comp.needs[f"{d.id}/power"] = max(comp.needs.get(f"{d.id}/power", 0.0), spec.window_s)
        if packages:
            comp.needs["cpu/utilization"] = max(comp.needs.get("cpu/utilization", 0.0), spec.window_s)
        total, how = devices_budget_w(spec)
        out.append(CBudget(spec, when, total, how, tuple(gpus), tuple(others), tuple(packages)))
    return tuple(out)


def choose(budgets: Sequence[CBudget], ctx: Any) -> CBudget | None:
    """The first budget whose ``when`` holds (one without ``when`` always does)."""
    for b in budgets:
        ctx.scope, ctx.stats = None, {}
        if b.when is None or b.when.eval(ctx) is True:
            return b
    return None


# ----- one tick ------------------------------------------------------------------------------------------
def _value(kv: KnobValue | None) -> float | None:
    if kv is None or kv.status != Status.OK or kv.value is None:
        return None
    return float(kv.value)


def _mean(windows: Mapping[str, Any], ok: Any, key: str, window_s: float, now: float) -> float | None:
    """The mean over ``window_s``, or the last value when it jumped :data:`JUMP` × above it: a job that
    starts is seen at once, one that stops once the window has forgotten it (the split then errs toward
    giving, not taking), and the noise of single readings moves nothing."""
    w = windows.get(key)
    if w is None:
        return None
    mean = w.mean_upto(window_s, now)
    last = w.stat("last", 0.0, now) if key in ok else None
    if mean is None or (last is not None and last > JUMP * mean):
        return last
    return mean


@dataclass
class _Dev:
    consumer: split.Consumer
    knobs: tuple[Knob, ...]
    asks: tuple[float, ...]
    layer: Layer
    rule: str


def _ask(knob: Knob, merged: Mapping[str, Decision], inp: Any, found: dict[str, float],
         policy: str) -> tuple[float | None, Layer, str, bool]:
    """(ask W, layer, rule, fixed) of one knob."""
    dec = merged.get(knob.id)
    if dec is not None and dec.value is not None:
        fixed = dec.layer in (Layer.SAFETY, Layer.OVERRIDE)
        return float(dec.value), dec.layer, dec.rule, fixed
    now = _value(inp.knobs.get(knob.id))
    if knob.id not in found and now is not None:
        found[knob.id] = now
    value = found.get(knob.id)
    return value, Layer.POLICY, f"{policy}/{BUDGET_RULE}", False


def _gpu(dev_id: str, knob: Knob, cb: CBudget, merged: Mapping[str, Decision], inp: Any, windows: Any, ok: Any,
         found: dict[str, float], policy: str, chosen: bool, bound: frozenset[str]) -> _Dev | None:
    ask, layer, rule, fixed = _ask(knob, merged, inp, found, policy)
    kv = inp.knobs.get(knob.id)
    cur = _value(kv)
    if cur is not None and kv is not None and kv.extra:
        cur = max(cur, float(kv.extra.get("enforced_w", cur)))
    if ask is None:
        ask = knob.default if knob.default is not None else knob.max
    if ask is None:
        return None
    floor = min(knob.min if knob.min is not None else 0.0, ask)
    if not knob.writable:  # nothing will be written: what is in force stays
        fixed, cur = True, cur if cur is not None else ask
    elif fixed or not chosen:  # a safety, override or other decision lands this tick: count the higher
        fixed, cur = True, max(cur if cur is not None else ask, ask)
    now, w = inp.t_mono, cb.spec.window_s
    util = _mean(windows, ok, f"{dev_id}/utilization", w, now)
    draw = _mean(windows, ok, f"{dev_id}/power", w, now)
    busy = util is None or util >= cb.spec.idle_below_pct
    return _Dev(split.Consumer(dev_id, floor, ask, cur, draw, util, busy, fixed, dev_id in bound), (knob,), (ask,),
                layer, rule)


def _package(p: Package, cb: CBudget, merged: Mapping[str, Decision], inp: Any, windows: Any, ok: Any,
             found: dict[str, float], policy: str, bound: frozenset[str]) -> _Dev | None:
    knobs = tuple(k for k in (p.pl1, p.pl2) if k is not None)
    if not knobs:
        return None
    asks, curs, layer, rule, fixed = [], [], Layer.POLICY, f"{policy}/{BUDGET_RULE}", not cb.spec.cpu
    for k in knobs:
        ask, lay, r, fx = _ask(k, merged, inp, found, policy)
        if not ask:  # 0 µW: no limit set; the zone's maximum stands for it
            ask = k.max
        if ask is None:
            return None
        asks.append(ask)
        cur = _value(inp.knobs.get(k.id))
        curs.append(cur if cur else k.max)
        fixed = fixed or fx
        if lay != Layer.POLICY or r != f"{policy}/{BUDGET_RULE}":
            layer, rule = lay, r
    ceiling = max(asks)
    low = [k.min for k in knobs if k.min is not None]
    floor = min(max([*low, cb.spec.cpu_min_w]), ceiling)
    cur = None if None in curs else max(c for c in curs if c is not None)
    if not all(k.writable for k in knobs):  # nothing will be written: what is in force stays
        fixed, cur = True, cur if cur is not None else ceiling
    elif fixed:  # another decision may land this tick: count the higher
        cur = max(cur if cur is not None else ceiling, ceiling)
    now, w = inp.t_mono, cb.spec.window_s
    util = _mean(windows, ok, "cpu/utilization", w, now)
    draw = _mean(windows, ok, p.power_key, w, now)
    busy = util is None or util >= cb.spec.idle_below_pct
    return _Dev(split.Consumer(p.device_id, floor, ceiling, cur, draw, util, busy, fixed, p.device_id in bound),
                knobs, tuple(asks),
                layer, rule)


def _why(c: split.Consumer, s: split.Share) -> str:
    if s.why == "fixed":
        return f"{c.id} counted at {s.target:.0f} W (not the budget's to change)"
    if s.why == "idle":
        state = f"idle ({c.util:.0f} %)" if c.util is not None else "idle"
    elif s.why == "bound":
        state = "busy, held back by its limit" + (f" ({c.draw:.0f} W at {c.util:.0f} %)"
                                                   if c.draw is not None and c.util is not None else "")
    else:
        state = f"busy, drawing {c.draw:.0f} W at {c.util or 0:.0f} %: asks {s.demand:.0f} W"
    text = (f"{c.id} {state}; its rule asks {c.ceiling:.0f} W, minimum {split.floor_of(c):.0f} W → share "
            f"{s.target:.0f} W")
    if abs(s.grant - s.target) > split.EPS_W:
        text += f", {s.grant:.0f} W this tick (the rest once others' lower limits are in force)"
    return text


def apply(cb: CBudget, policy: str, merged: Mapping[str, Decision], inp: Any, windows: Mapping[str, Any],
          ok: Any, state: BudgetState | None) -> tuple[dict[str, Decision], dict[str, Any], BudgetState]:
    """The winning decisions with the budget's applied, the report, and the new state."""
    found = dict(state.found) if state is not None else {}
    bound = state.bound if state is not None else frozenset()
    devs: list[_Dev] = []
    for group, chosen in ((cb.gpus, True), (cb.others, False)):
        for dev_id, knob in group:
            d = _gpu(dev_id, knob, cb, merged, inp, windows, ok, found, policy, chosen, bound)
            if d is not None:
                devs.append(d)
    for p in cb.packages:
        d = _package(p, cb, merged, inp, windows, ok, found, policy, bound)
        if d is not None:
            devs.append(d)
    consumers = [d.consumer for d in devs]
    lowest = sum(c.in_force if c.fixed else c.floor for c in consumers)
    short = lowest - cb.devices_w if lowest > cb.devices_w + split.EPS_W else 0.0
    step = cb.spec.step_w
    shares = split.grant(cb.devices_w, consumers, split.split(cb.devices_w, consumers, step), step)
    out = dict(merged)
    report_devs: dict[str, Any] = {}
    allotted = drawn = 0.0
    whole = {d.consumer.id: round(shares[d.consumer.id].grant, 1) for d in devs}  # shared, never changed
    for d in devs:
        c, s = d.consumer, shares[d.consumer.id]
        why = _why(c, s)
        allotted += s.grant
        drawn += c.draw or 0.0
        report_devs[c.id] = {"ask_w": round(c.ceiling, 1), "floor_w": round(split.floor_of(c), 1),
                             "target_w": round(s.target, 1), "allotted_w": round(s.grant, 1),
                             "in_force_w": None if c.current is None else round(c.current, 1),
                             "drawn_w": None if c.draw is None else round(c.draw, 1),
                             "util_pct": None if c.util is None else round(c.util, 1),
                             "state": s.why if s.why in ("fixed", "idle") else "busy"}
        if c.fixed:
            continue
        inputs = {"budget_w": round(cb.devices_w, 1), "ask_w": round(c.ceiling, 1),
                  "floor_w": round(split.floor_of(c), 1), "share_w": round(s.target, 1), "state": report_devs[c.id]["state"]}
        if c.draw is not None:
            inputs["draw_w"] = round(c.draw, 1)
        if c.util is not None:
            inputs["util_pct"] = round(c.util, 1)
        inputs["split_w"] = whole
        reason = f"budget {cb.devices_w:.0f} W ({cb.how}): {why}"
        if short:
            reason += (f"; the budget is {short:.0f} W below the lowest limits of its devices ({lowest:.0f} W): "
                       "each is held at its minimum and it cannot hold")
        for knob, ask in zip(d.knobs, d.asks, strict=True):
            value = knob.clamp(min(ask, s.grant))  # a package: PL2 = its share, PL1 no more than that
            out[knob.id] = Decision(knob_id=knob.id, value=value, layer=d.layer, rule=f"{policy}/{BUDGET_RULE}",
                                    reason=reason, requested=min(ask, s.target), inputs=inputs)
    wall = None
    if cb.spec.wall_w is not None:
        wall = round((drawn + cb.spec.other_w) / _efficiency(cb.spec, drawn + cb.spec.other_w), 1)
    report = {"policy": policy, "budget_w": round(cb.devices_w, 1), "how": cb.how,
              "wall_w": cb.spec.wall_w, "other_w": cb.spec.other_w, "allotted_w": round(allotted, 1),
              "drawn_w": round(drawn, 1), "wall_drawn_w": wall, "devices": report_devs}
    if short:
        report["short_w"] = round(short, 1)
    now_bound = frozenset(c for c, s in shares.items() if s.why == "bound")
    return out, report, BudgetState(MappingProxyType(found), now_bound)
