"""A policy compiled for one machine (one tuple of devices): selectors resolved to knobs and channels,
conditions compiled, the windows they need listed. Built once per (policy, devices) and reused every tick."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from aithermd.model import Device, DeviceKind, Knob, KnobKind
from aithermd.policy import efficient, power_budget, quiet, selectors, sources
from aithermd.policy.conditions import Compiler, Node, Not
from aithermd.policy.kinds import (
    CpuKnobsRule,
    CpuPowerLimitRule,
    FanRule,
    GpuClocksRule,
    GpuPowerLimitRule,
    MixCurve,
    PidCurve,
    PointsCurve,
    parse_clock,
    parse_power,
)


@dataclass(frozen=True)
class CState:
    name: str
    enter: Node | None
    exit: Node | None
    min_dwell_s: float


@dataclass(frozen=True)
class CMachine:
    name: str
    per_gpu: bool
    scopes: tuple[str, ...]  # GPU ids, or ("machine",)
    states: tuple[CState, ...]


@dataclass(frozen=True)
class Target:
    knob: Knob
    scope: str | None  # the GPU id whose metrics and states the rule sees, or None machine-wide
    value: Any = None  # power rules: (kind, number) or W; cpu_knobs: ("choice", index); fan rules: unused


@dataclass(frozen=True)
class CRule:
    name: str
    kind: str
    when: Node | None
    targets: tuple[Target, ...]
    model: Any  # the schema rule
    curve_name: str | None = None
    curves: dict[str, Any] = field(default_factory=dict)  # every curve the rule's curve may reach, by name
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)  # leaf curve → the channels it reads
    agg: dict[str, str] = field(default_factory=dict)  # leaf curve → "max" | "min" | "mean"
    inputs: dict[str, tuple[sources.Input, ...]] = field(default_factory=dict)  # leaf curve → its inputs
    smooth: dict[str, tuple[str, float]] = field(default_factory=dict)  # leaf → (window key, smoothing_s)
    search: Any = None  # limit: efficient — the search's efficient.Spec

    @cached_property
    def channels(self) -> tuple[str, ...]:
        """Every channel its curves may read, in order (the safety layer's fan sources)."""
        return tuple(c for chans in self.sources.values() for c in chans)

    @cached_property
    def curve_keys(self) -> dict[str, dict[str, str]]:
        """Per target knob id: each curve's name → its key in the policy's curve states."""
        return {t.knob.id: {n: f"{self.name}|{t.knob.id}|{n}" for n in self.curves} for t in self.targets}


    @cached_property
    def memo_keys(self) -> dict[str, str]:
        """Per target knob id: the key of its kept fan decision in the policy's memo (memo.py)."""
        return {t.knob.id: f"{self.name}|{t.knob.id}" for t in self.targets}

    @cached_property
    def memo_key(self) -> str:
        """The rule's own key in the policy's memo: its name and scope (a per-GPU rule has one per GPU)."""
        return f"{self.name}|{self.targets[0].scope if self.targets else None}"

    @cached_property
    def fan_limits(self) -> dict[str, tuple[float, float | None, float | None]]:
        """Per target knob id: ``(min duty, start duty, stop duty)`` (%) (:func:`aithermd.policy.rules.
        fan_limits` of the rule and the knob as compiled: a new calibration is a new device, a new plan)."""
        from aithermd.policy.rules import fan_limits
        return {t.knob.id: fan_limits(self.model, t.knob) for t in self.targets}


@dataclass(frozen=True)
class Plan:
    policy: Any
    devices: tuple[Device, ...]
    machines: tuple[CMachine, ...]
    rules: tuple[CRule, ...]
    needs: dict[str, float]  # window key → horizon (s)
    uses_processes: bool
    knobs: dict[str, Knob]
    budgets: tuple[Any, ...] = ()  # power_budget.CBudget per budget block
    quiet: tuple[Any, ...] = ()  # quiet.CQuiet per quiet block


def _leaves(name: str, curves: dict[str, Any], seen: set[str]) -> dict[str, Any]:
    if name in seen:
        return {}
    seen.add(name)
    curve = curves.get(name)
    if isinstance(curve, MixCurve):
        out: dict[str, Any] = {}
        for ref in curve.curves:
            out.update(_leaves(ref, curves, seen))
        return out
    return {name: curve} if curve is not None else {}


def _reachable(name: str, curves: dict[str, Any], seen: set[str]) -> None:
    if name in seen or name not in curves:
        return
    seen.add(name)
    if isinstance(curves[name], MixCurve):
        for ref in curves[name].curves:
            _reachable(ref, curves, seen)


def _fan_rule(rule: FanRule, i: int, comp: Compiler, devices: Sequence[Device],
              when: Node | None) -> list[CRule]:
    """The compiled fan rule; a curve whose source names the fan's own GPU (``same_gpu``) is compiled once
    per GPU among the targets (one rule each, the same name: each GPU's fans read its own channels)."""
    by_knob = {k.id: d for d in devices for k in d.knobs}
    targets = tuple(Target(k, by_knob[k.id].id if by_knob[k.id].kind == DeviceKind.GPU else None)
                    for k in selectors.select_fans(rule.fans, devices))
    all_curves = dict(comp.doc.curves)
    curve_name = None
    if isinstance(rule.curve, str):
        curve_name = rule.curve
    elif rule.curve is not None:
        curve_name = f"{rule.name}:inline"
        all_curves[curve_name] = rule.curve
    reach: set[str] = set()
    leaves: dict[str, Any] = {}
    if curve_name is not None:
        _reachable(curve_name, all_curves, reach)
        leaves = {n: c for n, c in _leaves(curve_name, all_curves, set()).items()
                  if isinstance(c, PointsCurve | PidCurve)}
    per_gpu = any(sources.uses_same_gpu(c.source) for c in leaves.values())
    scopes = list(dict.fromkeys(t.scope for t in targets)) if per_gpu else [None]
    out = []
    for scope in scopes:
        chans: dict[str, tuple[str, ...]] = {}
        agg: dict[str, str] = {}
        inputs: dict[str, tuple[sources.Input, ...]] = {}
        smooth: dict[str, tuple[str, float]] = {}
        for leaf, curve in leaves.items():
            fn, inputs[leaf] = sources.compile_source(curve.source, devices, gpu=scope)
            chans[leaf] = sources.channels(inputs[leaf])
            agg[leaf] = fn
            if curve.smoothing_s > 0 and inputs[leaf]:
                key = sources.key(fn, inputs[leaf])
                comp.needs[key] = max(comp.needs.get(key, 0.0), curve.smoothing_s)
                smooth[leaf] = (key, curve.smoothing_s)
        mine = tuple(t for t in targets if t.scope == scope) if per_gpu else targets
        out.append(CRule(rule.name, "fan", when, mine, rule, curve_name, {n: all_curves[n] for n in reach},
                         sources=chans, agg=agg, inputs=inputs, smooth=smooth))
    return out


def compile_plan(policy: Any, devices: tuple[Device, ...]) -> Plan:
    """Resolve ``policy`` (a loader.Policy) against ``devices``."""
    doc = policy.document
    comp = Compiler(doc, devices)
    machines = []
    for mname, m in doc.machines.items():
        scopes = (tuple(d.id for d in selectors.select_gpus(m.gpus, devices)) if m.per == "gpu"
                  else ("machine",))
        states = []
        for i, st in enumerate(m.states):
            base = f"machines.{mname}.states[{i}]"
            enter = comp.compile(st.enter, f"{base}.enter")
            exit_ = comp.compile(st.exit, f"{base}.exit")
            if exit_ is None and i > 0 and enter is not None:
                exit_ = Not(f"{base}.exit(not enter)", 0.0, enter)
            states.append(CState(st.name, enter, exit_, st.min_dwell_s))
        machines.append(CMachine(mname, m.per == "gpu", scopes, tuple(states)))
    rules = []
    for i, rule in enumerate(doc.rules):
        when = comp.compile(rule.when, f"rules[{i}].when")
        if isinstance(rule, GpuPowerLimitRule | GpuClocksRule):
            power = isinstance(rule, GpuPowerLimitRule)
            spec = parse_power(rule.limit) if power else parse_clock(rule.max_mhz)
            kind = KnobKind.POWER_LIMIT if power else KnobKind.SM_CLOCK_LOCK
            targets = [Target(k, d.id, spec) for d in selectors.select_gpus(rule.gpus, devices)
                       if (k := selectors.knob_of(d, kind)) is not None]
            rules.append(CRule(rule.name, "gpu_power_limit" if power else "gpu_clocks", when, tuple(targets),
                               rule, search=search_spec(rule) if spec[0] == "efficient" else None))
        elif isinstance(rule, CpuPowerLimitRule):
            targets = []
            for d in selectors.select_zones(rule.zones, devices):
                for k in d.knobs:
                    if k.kind == KnobKind.PL1 and rule.pl1_w is not None:
                        targets.append(Target(k, None, ("w", rule.pl1_w)))
                    elif k.kind == KnobKind.PL2 and rule.pl2_w is not None:
                        targets.append(Target(k, None, ("w", rule.pl2_w)))
            rules.append(CRule(rule.name, "cpu_power_limit", when, tuple(targets), rule))
        elif isinstance(rule, CpuKnobsRule):
            wanted = rule.wanted()
            targets = [Target(k, None, ("choice", float(k.choices.index(wanted[k.kind]))))
                       for d in devices for k in d.knobs if wanted.get(k.kind) in k.choices]
            rules.append(CRule(rule.name, "cpu_knobs", when, tuple(targets), rule))
        else:
            rules.extend(_fan_rule(rule, i, comp, devices, when))
    knobs = {k.id: k for d in devices for k in d.knobs}
    budgets = power_budget.compile_budgets(doc, comp, devices)
    quiet_blocks = quiet.compile_quiet(doc, comp, devices, rules)
    return Plan(policy, devices, tuple(machines), tuple(rules), comp.needs, comp.uses_processes, knobs,
                budgets, quiet_blocks)


def search_spec(rule: GpuPowerLimitRule | GpuClocksRule) -> efficient.Spec:
    """The efficient-limit search's tuning from a rule (its defaults where the rule is silent)."""
    clocks = isinstance(rule, GpuClocksRule)
    d = efficient.CLOCK_SPEC if clocks else efficient.Spec()
    return efficient.Spec(
        clocks=clocks,
        budget=d.budget if rule.max_slowdown_pct is None else rule.max_slowdown_pct / 100.0,
        step=d.step if rule.step_pct is None else rule.step_pct / 100.0,
        measure_s=d.measure_s if rule.measure_s is None else rule.measure_s,
        floor=d.floor if rule.floor_pct is None else rule.floor_pct / 100.0,
        signal=rule.signal or d.signal)


def power_value(knob: Knob, spec: tuple[str, float]) -> float | None:
    """A parsed power value → W for ``knob`` (None when the knob lacks the needed constraint)."""
    kind, number = spec
    if kind in ("w", "choice"):  # a choice: the index into the knob's choices
        return number
    if kind == "pct":
        return None if knob.default is None else knob.default * number / 100.0
    if kind == "efficient":  # the search's own value (rules.py); its starting point is the default
        return knob.default
    return {"default": knob.default, "min": knob.min, "max": knob.max}[kind]
