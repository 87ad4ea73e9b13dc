"""The decision engine: a pure function of (input snapshot, previous state) → (decisions, new state).

No clock reads, no I/O: times come in :class:`EngineInput`, history lives in :class:`EngineState`. Each tick:

1. update the time-weighted windows the policies need (:mod:`aithermd.policy.windows`);
2. per policy (the active one, then the holds): step its state machines, then run its rules in order — for
   each knob the first rule whose ``when`` holds decides it (fans through :mod:`aithermd.policy.curves`; a
   steady fan decision whose inputs did not move is kept, :mod:`aithermd.policy.memo`);
   then its quiet mode (:mod:`aithermd.policy.quiet`: fans held to their noise ceilings, power lowered first);
3. the built-in safety layer (:mod:`aithermd.policy.safety`) and operator overrides;
4. arbitration (:mod:`aithermd.policy.arbiter`): safety > override > hold > policy, clamped to each knob
   (the very decisions of the last tick: its result again);
5. the node power budget of the strongest policy that has one (:mod:`aithermd.policy.power_budget`): the
   power limits the policies decided, split so that those in force never add up to more than the budget.

Knobs nobody decides are absent from ``EngineResult.decisions``: the daemon hands them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import is_
from types import MappingProxyType
from typing import Any

from aithermd.model import (
    EMPTY,
    Decision,
    Device,
    DeviceKind,
    KnobKind,
    KnobValue,
    Layer,
    Reading,
    _empty,
)
from aithermd.policy import arbiter, held, power_budget, quiet, safety, sampling
from aithermd.policy.conditions import Ctx, progress
from aithermd.policy.curves import CurveState, FanState
from aithermd.policy.plan import CMachine, CRule, Plan, compile_plan
from aithermd.policy.references import all_conditions
from aithermd.policy.rules import run_rule
from aithermd.policy.kinds import ProcessCondition
from aithermd.policy.windows import Window


@dataclass(frozen=True)
class EngineInput:
    """One tick's facts: monotonic and wall-clock time (s), devices, readings and knob values by id, device
    attributes, the running processes' names/command lines (only filled when :func:`needs_processes`), and
    the stall detector's actions (``fan_alarms``: pwm knob id → ``kick`` | ``stalled`` | ``failed``)."""

    t_mono: float
    t_wall: float
    devices: tuple[Device, ...]
    readings: Mapping[str, Reading]
    knobs: Mapping[str, KnobValue]
    attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)
    processes: frozenset[str] = frozenset()
    fan_alarms: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True)
class MachineState:
    index: int = 0
    since: float = 0.0
    settled: bool = False


@dataclass(frozen=True)
class PolicyState:
    machines: Mapping[tuple[str, str], MachineState] = field(default_factory=_empty)
    held: Mapping[str, float] = field(default_factory=_empty)
    curves: Mapping[str, CurveState] = field(default_factory=_empty)
    searches: Mapping[str, Any] = field(default_factory=_empty)  # efficient-limit searches (efficient.py)
    quiet: quiet.QuietState | None = None
    memo: Mapping[str, Any] = field(default_factory=_empty)  # fan decisions kept while steady (memo.py)


_NO_STATE = PolicyState()  # a policy's state before its first tick (frozen: shared, not made per tick)


@dataclass(frozen=True)
class EngineState:
    """Everything the engine remembers between ticks (immutable; pass it back next tick)."""

    windows: Mapping[str, Window] = field(default_factory=_empty)
    policies: Mapping[str, PolicyState] = field(default_factory=_empty)
    fans: Mapping[str, FanState] = field(default_factory=_empty)
    latched: Mapping[str, Any] = field(default_factory=_empty)  # safety latches and release ramps (safety.py)
    plans: tuple[Plan, ...] = ()
    sampler: sampling.Sampler | None = None
    safety: safety.SafetyPlan | None = None
    t_mono: float | None = None
    budget: power_budget.BudgetState | None = None
    idle: Mapping[str, held.GpuIdle] = field(default_factory=_empty)  # held-high idle memory (held.py)
    # (the layers, the knobs, what arbitration made of them, the read-only view of it handed out)
    arbitrated: tuple[Any, ...] | None = None
    # (active, holds, devices, policies, sampler, safety, plans, plans by policy, fan knob ids, any GPU):
    # what the last tick worked out from its policies and devices alone, used again while they are the very
    # same
    front: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class EngineResult:
    decisions: Mapping[str, Decision]
    state: EngineState
    states: Mapping[str, Mapping[str, str]]
    # per layer ("safety", "override", or a policy name): the decisions before arbitration
    layers: Mapping[str, Mapping[str, Decision]] = field(default_factory=_empty)
    budget: Mapping[str, Any] = field(default_factory=_empty)  # how the power budget was split (power_budget)
    held_idle: Mapping[str, held.HeldIdle] = field(default_factory=_empty)  # GPUs held high while idle


def initial_state() -> EngineState:
    return EngineState()


def needs_processes(policies: Sequence[Any]) -> bool:
    """True when any policy has a ``process`` condition (the daemon then lists processes each tick)."""
    return any(isinstance(c, ProcessCondition) for p in policies if p is not None
               for c, _loc in all_conditions(p.document))


def _plan(policy: Any, devices: tuple[Device, ...], cache: tuple[Plan, ...]) -> Plan:
    for p in cache:
        if p.policy is policy and (p.devices is devices or p.devices == devices):
            return p
    return compile_plan(policy, devices)


def _same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(map(is_, a, b))  # no generator made per tick


def _front(active: Any, holds: Sequence[Any], devices: tuple[Device, ...], state: EngineState
           ) -> tuple[list[Any], tuple[Plan, ...], dict[Any, Plan], Any, Any, frozenset[str]]:
    """What evaluate works out from the policies and devices alone: the policies in order, their plans
    (compiled, or the last tick's), the plans by policy, the windows' sampler, the safety plan and the ids
    of the fan knobs."""
    policies = [p for p in (active, *holds) if p is not None]
    plans = tuple(_plan(p, devices, state.plans) for p in dict.fromkeys(policies))
    by_policy = {p.policy: p for p in plans}
    same = state.sampler is not None and state.sampler.matches(plans)  # the very plans of the last tick
    sampler = state.sampler if same else sampling.build(plans)
    sp = state.safety
    if not same or sp is None or not (sp.devices is devices or sp.devices == devices):
        params = safety.SafetyParams(  # the same plans: the same policies, so the same parameters
            margin_c=max([p.document.safety.margin_c for p in policies] + [safety.SafetyParams().margin_c]),
            gpu_temp_limit_c=min((p.document.safety.gpu_temp_limit_c for p in policies
                                  if p.document.safety.gpu_temp_limit_c is not None), default=None))
        if sp is None or sp.params != params or not (sp.devices is devices or sp.devices == devices):
            sp = safety.plan(devices, params)
    fan_ids = frozenset(k for k, knob in sp.knobs.items() if knob.kind in (KnobKind.PWM, KnobKind.FAN))
    return policies, plans, by_policy, sampler, sp, fan_ids


def _step_machine(m: CMachine, scope: str, prev: MachineState | None, ctx: Ctx) -> MachineState:
    states, now = m.states, ctx.now
    if prev is not None and prev.index >= len(states):  # the policy was reloaded with fewer states
        prev = None
    if prev is None:
        prev = MachineState(0, now, settled=states[0].enter is None)
    i, settled = prev.index, prev.settled
    if settled and now - prev.since < states[i].min_dwell_s:
        return prev
    for j in range(len(states) - 1, i, -1):
        enter = states[j].enter
        if enter is not None and enter.eval(ctx) is True:
            return MachineState(j, now, True)
    if not settled:
        enter0 = states[0].enter
        if enter0 is not None and enter0.eval(ctx) is True:
            return MachineState(0, now, True)
        return prev
    exit_ = states[i].exit
    if i > 0 and exit_ is not None and exit_.eval(ctx) is True:
        return MachineState(i - 1, now, True)
    return prev


def _run_policy(plan: Plan, layer: Layer, inp: EngineInput, ps: PolicyState, windows: Mapping[str, Window],
                ok: set[str], fans: Mapping[str, FanState], fan_failed: dict[str, tuple[str, str]]
                ) -> tuple[dict[str, Decision], PolicyState, dict[str, str], dict[str, tuple[str, ...]], Any]:
    name = plan.policy.name
    ctx = Ctx(now=inp.t_mono, t_wall=inp.t_wall, windows=windows, ok=ok, processes=inp.processes,
              held=ps.held, searches=ps.searches)
    machines: dict[tuple[str, str], MachineState] = {}
    machine_stats: dict[str | None, dict[str, Any]] = {}
    states_out: dict[str, str] = {}
    for m in plan.machines:
        for scope in m.scopes:
            ctx.scope = scope if m.per_gpu else None
            ctx.stats = machine_stats.setdefault(ctx.scope, {})
            new = _step_machine(m, scope, ps.machines.get((m.name, scope)), ctx)
            machines[(m.name, scope)] = new
            state_name = m.states[new.index].name
            ctx.machine_states[(m.name, scope)] = (state_name, new.settled)
            ctx.stats[f"state:{m.name}"] = state_name if new.settled else f"{state_name} (starting)"
            dwell = m.states[new.index].min_dwell_s
            if new.settled and ctx.now - new.since < dwell:  # no way out of this state before then
                ctx.stats[f"dwell:{m.name}"] = progress(ctx.now - new.since, dwell)
            key = scope if len(plan.machines) == 1 else f"{m.name}/{scope}"
            states_out[key] = state_name
    decisions: dict[str, Decision] = {}
    curve_states: dict[str, CurveState] = {}
    fan_sources: dict[str, tuple[str, ...]] = {}
    pending: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    for rule in plan.rules:
        if rule.targets:  # a rule for knobs this machine lacks: nothing to decide, its when never runs
            run_rule(rule, ctx, name, layer, inp, machine_stats, ps.curves, curve_states, fans, decisions,
                     fan_sources, fan_failed, pending, ps.memo, kept)
    calm = quiet.choose(plan.quiet, ctx) if plan.quiet else None
    quiet_state = quiet.apply(calm, name, layer, decisions, ctx, inp, ps.quiet) if calm is not None else None
    budget = power_budget.choose(plan.budgets, ctx) if plan.budgets else None
    return decisions, PolicyState(MappingProxyType(machines), MappingProxyType(ctx.held_new),
                                  MappingProxyType(curve_states), MappingProxyType(ctx.searches_new),
                                  quiet_state, MappingProxyType(kept)), states_out, fan_sources, budget


def _same(before: Sequence[Mapping[str, Decision]], now: Sequence[Mapping[str, Decision]]) -> bool:
    """Whether every layer holds the very Decision objects it held before, for the same knobs."""
    if len(before) != len(now):
        return False
    for a, b in zip(before, now, strict=True):
        if len(a) != len(b):
            return False
        for k, d in b.items():
            if a.get(k) is not d:
                return False
    return True


def evaluate(active: Any, holds: Sequence[Any], inp: EngineInput, state: EngineState,
             overrides: Mapping[str, float] = EMPTY) -> EngineResult:
    """Decide every knob for this tick. ``active``: the active Policy (or None); ``holds``: held policies,
    last strongest; ``overrides``: knob id → operator value (daemon units). Pure: no clock, no I/O."""
    front = state.front
    if (front is not None and front[0] is active and front[2] is inp.devices and front[4] is state.sampler
            and front[5] is state.safety and _same_items(front[1], holds)):
        # the very policies and devices of the last tick: its plans, sampler, safety plan and fan knobs
        _, _, _, policies, sampler, sp, plans, by_policy, fan_ids, has_gpu = front
    else:
        policies, plans, by_policy, sampler, sp, fan_ids = _front(active, holds, inp.devices, state)
        has_gpu = any(d.kind == DeviceKind.GPU for d in inp.devices)
        front = (active, tuple(holds), inp.devices, policies, sampler, sp, plans, by_policy, fan_ids, has_gpu)
    if has_gpu:
        idle, held_now = held.update(state.idle, inp.devices, inp.readings, inp.attrs, inp.t_mono)
        derived = held.derived_readings(inp.devices, held_now)
        readings = {**inp.readings, **derived} if derived else inp.readings
    else:  # no GPU, nothing held high: what held.update gives then
        idle, held_now, readings = {}, {}, inp.readings
    windows, ok = sampling.update(sampler, inp.t_mono, readings, inp.knobs, state.windows)
    knobs = sp.knobs  # every knob of inp.devices by id
    layers: list[dict[str, Decision]] = []
    new_policies: dict[str, PolicyState] = {}
    states: dict[str, Mapping[str, str]] = {}
    fan_sources: dict[str, tuple[str, ...]] = {}
    fan_failed: dict[str, tuple[str, str]] = {}
    budget: tuple[power_budget.CBudget, str] | None = None
    for idx, policy in enumerate(policies):
        layer = Layer.POLICY if idx == 0 and policy is active else Layer.HOLD
        last_ps = state.policies.get(policy.name)
        decisions, ps, st, sources, chosen = _run_policy(by_policy[policy], layer, inp,
                                                         _NO_STATE if last_ps is None else last_ps,
                                                         windows, ok, state.fans, fan_failed)
        if chosen is not None:
            budget = (chosen, policy.name)  # the strongest policy with a budget in force has its way
        layers.append(decisions)
        new_policies[policy.name] = ps
        states[policy.name] = MappingProxyType(st)
        for fan, src in sources.items():
            fan_sources[fan] = tuple(dict.fromkeys((*fan_sources.get(fan, ()), *src)))
    safe, latched = safety.evaluate(sp, inp.readings, fan_sources, state.latched, inp.t_mono,
                                    fan_failed=fan_failed, fans=inp.fan_alarms, knob_values=inp.knobs)
    override = arbiter.override_decisions(overrides, knobs) if overrides else {}
    decided = (*layers, override, safe)
    last = state.arbitrated
    if last is not None and last[1] is knobs and _same(last[0], decided):
        # the very decisions of the last tick: the same winners (not changed below), the same view of them
        merged, view = last[2], last[3]
    else:
        merged = arbiter.merge(decided, knobs)
        view = MappingProxyType(merged)
    arbitrated = (decided, knobs, merged, view)
    report: Mapping[str, Any] = EMPTY
    budget_state = state.budget
    if budget is not None:
        merged, report, budget_state = power_budget.apply(budget[0], budget[1], merged, inp, windows, ok,
                                                          state.budget)
    fans: dict[str, FanState] = {}  # the fans still decided: this tick's duty, else their last
    last_fans = state.fans
    for kid, dec in merged.items():
        if kid in fan_ids and dec.value is not None:
            fans[kid] = FanState(dec.value, inp.t_mono)
        elif (was := last_fans.get(kid)) is not None:
            fans[kid] = was
    new_state = EngineState(windows=MappingProxyType(windows), policies=MappingProxyType(new_policies),
                            fans=MappingProxyType(fans), latched=latched, plans=plans, sampler=sampler,
                            safety=sp, t_mono=inp.t_mono, budget=budget_state,
                            idle=MappingProxyType(idle), arbitrated=arbitrated, front=front)
    by_layer = {"safety": safe, "override": override}
    for policy, decs in zip(policies, layers, strict=True):
        by_layer[policy.name] = decs
    if merged is not arbitrated[2]:  # the power budget changed some
        view = MappingProxyType(merged)
    return EngineResult(decisions=view, state=new_state,
                        states=MappingProxyType(states), layers=MappingProxyType(by_layer), budget=report,
                        held_idle=MappingProxyType(held_now))


__all__ = ["EngineInput", "EngineResult", "EngineState", "evaluate", "initial_state", "needs_processes",
           "CRule"]
