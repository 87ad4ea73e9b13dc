"""Device references of a policy checked against one machine (``aithermd check --sysfs-root``/``--simulate``).

A selector written without wildcards (an exact GPU index or UUID, fan id, chip or zone) must match
something (an error, naming what the machine has); one with wildcards may match nothing (shipped policies
name several chips so they fit many boards). A curve source or a ``temperature_c`` sensor must match at
least one temperature channel, except a named curve that only rules driving no fan on this machine use (the
shipped GPU fan curve on a machine without GPUs).

Warnings (:func:`device_warnings`, printed by ``aithermd check``; the policy stays valid): a fan rule whose
selector, with wildcards, selects no fan here (it does nothing on this machine), and a power limit that this
machine's devices clamp to their own constraints (a ``limit: 1000`` on a 600 W card is set to 600 W), and
each pattern of a curve's source that matches no sensor here (:func:`source_warnings`; a required one sends
that curve's fans to full, see :mod:`aithermd.policy.sources`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from aithermd.errors import PolicyError
from aithermd.model import Device, Knob, KnobKind
from aithermd.policy import selectors, sources
from aithermd.policy.kinds import (
    CpuKnobsRule,
    CpuPowerLimitRule,
    FanMatch,
    FanRule,
    GpuClocksRule,
    GpuMatch,
    GpuPowerLimitRule,
    MetricCondition,
    MixCurve,
    PidCurve,
    PointsCurve,
    parse_clock,
    parse_power,
)
from aithermd.policy.references import all_conditions

WILD = set("*?[")


def _exact(patterns: Sequence[Any] | None) -> bool:
    return patterns is not None and all(not (WILD & set(str(p))) for p in patterns)


def _gpu_problem(match: GpuMatch, devices: Sequence[Device]) -> str | None:
    if selectors.select_gpus(match, devices):
        return None
    if match.index is not None or _exact(match.uuid) or _exact(match.model):
        have = ", ".join(d.id for d in selectors.gpus(devices)) or "none"
        return f"selects no GPU on this machine (GPUs: {have})"
    return None


def _fans_here(devices: Sequence[Device]) -> str:
    """The fans of ``devices``, for a message: "hwmon:nct6798-isa-0290/pwm1, ... and 3 more", or "none"."""
    fans = [k.id for k in selectors.select_fans(FanMatch(id=None, chip=None, label=None), devices)]
    return ", ".join(fans[:6]) + (f" and {len(fans) - 6} more" if len(fans) > 6 else "") or "none"


def check_devices(policy: Any, devices: Sequence[Device]) -> list[PolicyError]:
    """Every device reference of ``policy`` (a loader.Policy) that this machine cannot satisfy."""
    doc, where = policy.document, str(policy.path or f"<{policy.name}>")
    problems: list[tuple[tuple[Any, ...], str]] = []
    for mname, machine in doc.machines.items():
        if machine.per == "gpu":
            msg = _gpu_problem(machine.gpus, devices)
            if msg:
                problems.append((("machines", mname, "gpus"), msg))
    for i, rule in enumerate(doc.rules):
        loc = ("rules", i, rule.kind)
        if isinstance(rule, GpuPowerLimitRule | GpuClocksRule):
            msg = _gpu_problem(rule.gpus, devices)
            if msg:
                problems.append(((*loc, "gpus"), msg))
        elif isinstance(rule, CpuPowerLimitRule):
            if not selectors.select_zones(rule.zones, devices) and _exact(rule.zones):
                problems.append(((*loc, "zones"), "selects no RAPL zone on this machine"))
        elif isinstance(rule, CpuKnobsRule):
            for kind, name in rule.wanted().items():
                knob = next((k for d in devices for k in d.knobs if k.kind == kind), None)
                if knob is not None and name not in knob.choices:
                    key = "boost" if kind == "boost" else kind
                    problems.append(((*loc, key), f"'{name}' is not offered by this machine's {knob.id} "
                                                  f"(it offers: {', '.join(knob.choices)})"))
        elif isinstance(rule, FanRule):
            f = rule.fans
            if not selectors.select_fans(f, devices) and any(_exact(p) for p in (f.id, f.chip, f.label)):
                problems.append(((*loc, "fans"), f"selects no fan on this machine (fans: "
                                 f"{_fans_here(devices)}); name one of them, or write a pattern with * that "
                                 "may select none here"))
            if rule.curve is not None and not isinstance(rule.curve, str | MixCurve):
                pats = sources.patterns(rule.curve.source)
                if not selectors.select_temperatures(pats, devices):
                    problems.append(((*loc, "curve", "inline", rule.curve.kind, "source"),
                                     "no temperature channel on this machine matches this source"))
    problems += _budget_problems(doc, devices)
    idle = _curves_of_idle_rules(doc, devices)
    for name, curve in doc.curves.items():
        if isinstance(curve, MixCurve) or name in idle:
            continue
        pats = sources.patterns(curve.source)
        if not selectors.select_temperatures(pats, devices):
            problems.append((("curves", name, curve.kind, "source"),
                             "no temperature channel on this machine matches this source"))
    for cond, loc in all_conditions(doc):
        if isinstance(cond, MetricCondition) and cond.sensor is not None:
            if not selectors.select_temperatures(cond.sensor, devices):
                problems.append(((*loc, "sensor"), "no temperature channel on this machine matches"))
    return _placed(policy, where, problems)


def _budget_problems(doc: Any, devices: Sequence[Device]) -> list[tuple[tuple[Any, ...], str]]:
    """A budget below the sum of the lowest limits of what it covers can never hold: say so."""
    from aithermd.policy.power_budget import devices_budget_w

    blocks = doc.budget if isinstance(doc.budget, list) else [doc.budget] if doc.budget is not None else []
    out = []
    for i, spec in enumerate(blocks):
        lows: list[tuple[str, float]] = []
        for d in selectors.gpus(devices):
            k = selectors.knob_of(d, KnobKind.POWER_LIMIT)
            if k is not None:
                lows.append((d.id, k.min or 0.0))
        for d in selectors.select_zones(["package-*"], devices):
            pl = [k for k in d.knobs if k.kind in (KnobKind.PL1, KnobKind.PL2)]
            if pl:
                low = max([k.min or 0.0 for k in pl] + [spec.cpu_min_w]) if spec.cpu else max(
                    k.max or 0.0 for k in pl)
                lows.append((d.id, low))
        total, _ = devices_budget_w(spec)
        need = sum(w for _, w in lows)
        if lows and need > total + 1e-6:
            key = "wall_w" if spec.wall_w is not None else "devices_w"
            each = ", ".join(f"{dev} {w:.0f} W" for dev, w in lows)
            loc = ("budget", i, key) if isinstance(doc.budget, list) else ("budget", key)
            out.append((loc, f"gives the devices {total:.0f} W, below the sum of their lowest limits ({need:.0f} W: "
                             f"{each}): it can never hold; raise it, or leave devices out (gpus:, cpu: false)"))
    return out


def _curves_of_idle_rules(doc: Any, devices: Sequence[Device]) -> set[str]:
    """Named curves used (directly or through mix curves) only by fan rules that select no fan here."""
    def reach(rules: list[FanRule]) -> set[str]:
        seen: set[str] = set()
        todo = [n for r in rules for n in ([r.curve] if isinstance(r.curve, str)
                                           else r.curve.curves if isinstance(r.curve, MixCurve) else [])]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                curve = doc.curves.get(name)
                todo.extend(curve.curves if isinstance(curve, MixCurve) else [])
        return seen
    fan_rules = [r for r in doc.rules if isinstance(r, FanRule)]
    return reach(fan_rules) - reach([r for r in fan_rules if selectors.select_fans(r.fans, devices)])


def unsourced_fans(policy: Any, devices: Sequence[Device]) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(rule, curve, fan knob ids)`` for each fan rule of ``policy`` that drives fans on ``devices`` from a
    curve whose source selects no temperature channel there: those fans can only run at 100 %."""
    from aithermd.policy.plan import compile_plan

    out = []
    for rule in compile_plan(policy, tuple(devices)).rules:
        if rule.kind != "fan" or not rule.targets or rule.curve_name is None:
            continue
        empty = sorted(leaf for leaf, inputs in rule.inputs.items() if not inputs)
        if empty or not rule.inputs:
            fans = tuple(t.knob.id for t in rule.targets)
            out.append((rule.name, ", ".join(empty) or rule.curve_name, fans))
    return out


def device_warnings(policy: Any, devices: Sequence[Device]) -> list[PolicyError]:
    """What ``policy`` (a loader.Policy) asks that this machine will not do as written (see the module
    docstring), each at its place in the file; format them with ``format("warning")``."""
    doc, where = policy.document, str(policy.path or f"<{policy.name}>")
    problems: list[tuple[tuple[Any, ...], str]] = []
    have = _fans_here(devices)
    for i, rule in enumerate(doc.rules):
        loc = ("rules", i, rule.kind)
        if isinstance(rule, FanRule) and not selectors.select_fans(rule.fans, devices) \
                and not any(_exact(p) for p in (rule.fans.id, rule.fans.chip, rule.fans.label)):
            problems.append(((*loc, "fans"), "selects no fan on this machine, so this rule does nothing "
                                             f"here (fans: {have})"))
        elif isinstance(rule, GpuPowerLimitRule | GpuClocksRule):
            power = isinstance(rule, GpuPowerLimitRule)
            how, value = parse_power(rule.limit) if power else parse_clock(rule.max_mhz)
            if how in ("w", "pct"):  # as the engine works it out (plan.power_value): % of the default
                kind = KnobKind.POWER_LIMIT if power else KnobKind.SM_CLOCK_LOCK
                knobs = [k for d in selectors.select_gpus(rule.gpus, devices)
                         if (k := selectors.knob_of(d, kind)) is not None]
                asked = {k.id: value if how == "w" else (k.default or math.nan) * value / 100 for k in knobs}
                problems += _clamped((*loc, "limit" if power else "max_mhz"), knobs, asked,
                                     "W" if power else "MHz")
        elif isinstance(rule, CpuPowerLimitRule):
            for key, kind in (("pl1_w", KnobKind.PL1), ("pl2_w", KnobKind.PL2)):
                if (value := getattr(rule, key)) is not None:
                    knobs = [k for d in selectors.select_zones(rule.zones, devices) for k in d.knobs
                             if k.kind == kind]
                    problems += _clamped((*loc, key), knobs, dict.fromkeys((k.id for k in knobs), value))
    problems += _quiet_problems(policy, devices)
    return [*_placed(policy, where, problems), *source_warnings(policy, devices)]


def _quiet_problems(policy: Any, devices: Sequence[Device]) -> list[tuple[tuple[Any, ...], str]]:
    """A quiet ceiling under the minimum duty of the rule driving its fans (held at that minimum instead),
    and one over a rule that reads no temperature (held at the ceiling until one nears danger)."""
    from aithermd.policy.plan import compile_plan
    from aithermd.policy.rules import fan_limits

    doc = policy.document
    blocks = doc.quiet if isinstance(doc.quiet, list) else [doc.quiet] if doc.quiet is not None else []
    if not blocks:
        return []
    rules = [r for r in compile_plan(policy, tuple(devices)).rules if r.kind == "fan"]
    out: list[tuple[tuple[Any, ...], str]] = []
    for i, block in enumerate(blocks):
        at = ("quiet", i) if isinstance(doc.quiet, list) else ("quiet",)
        for j, group in enumerate(block.fans):
            floors: dict[str, list[str]] = {}
            fixed: set[str] = set()
            for knob in selectors.select_fans(group.fans, devices):
                rule = next((r for r in rules if any(t.knob.id == knob.id for t in r.targets)), None)
                if rule is None:
                    continue
                low = fan_limits(rule.model, knob)[0]
                if group.max_duty_pct is not None and low > group.max_duty_pct:
                    floors.setdefault(f"{low:g} % (rule {rule.name})", []).append(knob.id)
                if rule.curve_name is None:  # a curve whose source matches nothing is unsourced_fans' case
                    fixed.add(rule.name)
            if floors:
                held = "; ".join(f"{v} for {', '.join(ids)}" for v, ids in floors.items())
                out.append(((*at, "fans", j, "max_duty_pct"), "below the minimum duty of the rule driving "
                            f"these fans, which hold that instead: {held}"))
            if fixed:
                out.append(((*at, "fans", j), f"rule {', '.join(sorted(fixed))} reads no temperature "
                            "(a fixed duty): quiet cannot lower power for these fans and holds them at the "
                            "ceiling until a watched temperature comes within danger_margin_c of its safety "
                            "threshold; give the rule a curve"))
    return out


def source_warnings(policy: Any, devices: Sequence[Device]) -> list[PolicyError]:
    """Each pattern of a curve's source (named or inline, of a fan rule driving fans here) that matches no
    temperature sensor on ``devices``, at its place in the file (:func:`.sources.unmatched`)."""
    doc, where = policy.document, str(policy.path or f"<{policy.name}>")
    curves: list[tuple[tuple[Any, ...], Any]] = []
    idle = _curves_of_idle_rules(doc, devices)
    for name, curve in doc.curves.items():
        if not isinstance(curve, MixCurve) and name not in idle:
            curves.append((("curves", name, curve.kind, "source"), curve.source))
    for i, rule in enumerate(doc.rules):
        inline = isinstance(rule, FanRule) and rule.curve is not None \
            and not isinstance(rule.curve, str | MixCurve)
        if inline and selectors.select_fans(rule.fans, devices):
            curves.append((("rules", i, rule.kind, "curve", "inline", rule.curve.kind, "source"),
                           rule.curve.source))
    out: list[tuple[tuple[Any, ...], str]] = []
    for loc, agg in curves:
        if not selectors.select_temperatures(sources.patterns(agg), devices):
            continue  # the whole source matches nothing: check_devices says so (an error)
        fn = sources.entries(agg)[0]
        for index, pattern, required in sources.unmatched(agg, devices):
            what = (": a required input, so the fans of this curve run at 100 % here (name a sensor "
                    "`aithermd sensors` shows, or mark it optional: true)" if required
                    else ", so the curve runs on its other inputs here")
            out.append(((*loc, fn, index),
                        f"'{pattern}' matches no temperature sensor on this machine{what}"))
    return _placed(policy, where, out)


def curve_warnings(policy: Any) -> list[PolicyError]:
    """Each points curve (named, or inline in a fan rule) whose duty falls as the temperature rises, at the
    point where it does: almost always two points swapped (fan2go refuses such a curve), and the fans would
    slow down as it heats; each PID curve with a negative gain, at that gain (attack5 C9). Needs no
    machine."""
    doc, where = policy.document, str(policy.path or f"<{policy.name}>")
    found = [(("curves", name, curve.kind, "points"), curve) for name, curve in doc.curves.items()]
    found += [(("rules", i, rule.kind, "curve", "inline", rule.curve.kind, "points"), rule.curve)
              for i, rule in enumerate(doc.rules) if isinstance(rule, FanRule) and rule.curve is not None
              and not isinstance(rule.curve, str | MixCurve)]
    out: list[tuple[tuple[Any, ...], str]] = []
    for loc, curve in found:
        if isinstance(curve, PidCurve):  # duty = base + kp·e + ki·∫e + kd·de/dt, e = temperature − setpoint
            neg = [f"{g} {getattr(curve, g):g}" for g in ("kp", "ki", "kd") if getattr(curve, g) < 0]
            if neg:
                verb = "are" if neg[1:] else "is"
                out.append(((*loc[:-1], neg[0].split()[0]),
                            f"{' and '.join(neg)} {verb} negative: the duty would fall as the temperature "
                            "rises (e = temperature − setpoint); drop the minus sign"))
            continue
        if not isinstance(curve, PointsCurve):
            continue
        for k, ((t0, d0), (t1, d1)) in enumerate(zip(curve.points, curve.points[1:], strict=False)):
            if d1 < d0:
                out.append(((*loc, k + 1), f"the duty falls from {d0:g} % at {t0:g} °C to {d1:g} % at {t1:g} "
                            "°C: the fans would slow down as it heats (two points swapped?)"))
                break
    return _placed(policy, where, out)


def _placed(policy: Any, where: str, problems: Sequence[tuple[tuple[Any, ...], str]]) -> list[PolicyError]:
    """``problems`` (loc, message) at their places in the policy's file; the file's syntax tree is parsed
    (and pydantic imported) only when there is something to place."""
    if not problems:
        return []
    from aithermd.policy.locate import error_at
    tree = policy.syntax_tree()
    return [error_at(tree, where, loc, msg) for loc, msg in problems]


def _clamped(loc: tuple[Any, ...], knobs: Sequence[Knob], asked: dict[str, float],
             unit: str = "W") -> list[tuple[Any, str]]:
    """One warning for the ``knobs`` that clamp the values ``asked`` of them (in ``unit``) to their own
    constraints."""
    out = [f"{k.id} {asked[k.id]:.0f} {unit} → {k.clamp(asked[k.id]):.0f} {unit}" for k in knobs
           if math.isfinite(asked[k.id]) and abs(k.clamp(asked[k.id]) - asked[k.id]) > 0.5]
    if not out:
        return []
    return [(loc, f"clamped to the devices' own constraints: {', '.join(out)}")]
