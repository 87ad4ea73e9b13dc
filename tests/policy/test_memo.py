"""No work for unchanged inputs (aithermd.policy.memo): a fan rule's decision is given back as the same object
while nothing it depends on moves (and the same decisions are not arbitrated again), and it still reacts to
every kind of change: a reading, a failed reading, a window that fills (a state machine), an override, a
hold, a reload, a ramp still under way, a critical temperature. A decision's inputs are built when read
(aithermd.policy.explain). Each tick is also checked against the same tick worked out with the memory
cleared: keeping a decision never changes one."""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType

import pytest

from aithermd.model import EMPTY, Layer, Status
from aithermd.policy import engine, memo
from aithermd.policy.curves import CurveState, pid_pinned
from aithermd.policy.explain import Lazy, eager_items
from aithermd.policy.loader import load_policy_text
from aithermd.policy.plan import compile_plan

from .machines import K10, NCT, k10temp, nct, tick

PWM1, PWM2 = f"{NCT}/pwm1", f"{NCT}/pwm2"
TCTL, SYSTIN = f"{K10}/temp1", f"{NCT}/temp1"
POLICY = """
machines:
  thermal:
    per: machine
    states:
      - name: cool
      - name: hot
        enter: {metric: temperature_c, sensor: SYSTIN, stat: mean, window_s: 10, above: 70}
        exit: {metric: temperature_c, sensor: SYSTIN, stat: mean, window_s: 10, below: 60}
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 30], [80, 100]], hysteresis_c: 3}
  case: {kind: pid, source: SYSTIN, setpoint_c: 45, kp: 2, ki: 1}
  both: {kind: mix, fn: max, curves: [cpu, case]}
rules:
  - {name: hot, kind: fan, fans: {id: ["*/pwm1"]}, when: {state: thermal.hot}, duty_pct: 90}
  - {name: cpu-fan, kind: fan, fans: {id: ["*/pwm1"]}, curve: cpu}
  - {name: case, kind: fan, fans: {id: ["*/pwm2"]}, curve: both, ramp_up_pct_s: 5, ramp_down_pct_s: 5}
"""
HOLD = """
rules:
  - {name: loud, kind: fan, fans: {id: ["*/pwm1"]}, duty_pct: 70}
"""
DEVICES = (nct(), k10temp(crit=100.0))


def view(decisions):
    return {k: (d.value, d.layer, d.rule, d.reason, d.requested, dict(d.inputs))
            for k, d in decisions.items()}


def forgetful(state: engine.EngineState) -> engine.EngineState:
    kept = {n: replace(ps, memo=EMPTY) for n, ps in state.policies.items()}
    return replace(state, policies=MappingProxyType(kept), arbitrated=None)


class Run:
    """Ticks the engine once a second; each tick is checked against the same tick without the memory."""

    def __init__(self, policy=None) -> None:
        self.policy = policy or load_policy_text(POLICY, name="p")
        self.state = engine.initial_state()
        self.t = 0.0
        self.values = {TCTL: 50.0, SYSTIN: 40.0}

    def step(self, holds=(), overrides=EMPTY, dt=1.0, **values):
        self.values.update(values)
        self.t += dt
        inp = tick(DEVICES, self.t, dict(self.values), knobs={PWM2: 30.0})
        res = engine.evaluate(self.policy, list(holds), inp, self.state, overrides)
        fresh = engine.evaluate(self.policy, list(holds), inp, forgetful(self.state), overrides)
        assert view(res.decisions) == view(fresh.decisions)
        assert res.state.policies["p"].curves == fresh.state.policies["p"].curves
        assert res.state.fans == fresh.state.fans
        self.state = res.state
        return res

    def settle(self, n=40, **kw):
        for _ in range(n):
            res = self.step(**kw)
        return res


def test_unchanged_inputs_give_back_the_same_decision_object():
    run = Run()
    first = run.settle()
    again = run.step()
    assert again.decisions[PWM1] is first.decisions[PWM1]
    assert again.decisions[PWM2] is first.decisions[PWM2]  # its ramp done, its PID pinned at its bound
    assert again.state.arbitrated[2] is first.state.arbitrated[2]  # the same decisions: not arbitrated again
    assert first.decisions[PWM1].value == pytest.approx(47.5)
    assert first.decisions[PWM1].inputs["source:cpu"] == 50.0
    assert first.decisions[PWM1].inputs["state:thermal"] == "cool"


def test_a_reading_that_moves_is_followed_at_once():
    run = Run()
    kept = run.settle().decisions[PWM1]
    moved = run.step(**{TCTL: 60.0}).decisions[PWM1]
    assert moved is not kept and moved.value == pytest.approx(65.0)
    # within the hysteresis the reference temperature stays: the same value, worked out again once
    down = run.step(**{TCTL: 58.5}).decisions[PWM1]
    assert down.value == pytest.approx(65.0) and down.inputs["source:cpu"] == 58.5


def test_a_failed_reading_sends_the_fans_to_full_and_its_return_gives_them_back():
    run = Run()
    run.settle()
    res = run.step(**{TCTL: Status.FAILED})
    assert res.decisions[PWM1].layer is Layer.SAFETY and res.decisions[PWM1].value == 100.0
    assert PWM1 not in res.layers["p"]
    res = run.step(**{TCTL: 50.0})
    assert res.decisions[PWM1].rule == "p/cpu-fan" and res.decisions[PWM1].value == pytest.approx(47.5)


def test_a_window_that_fills_changes_the_state_while_the_rules_inputs_stand_still():
    run = Run()
    run.settle()
    rules = []
    for _ in range(12):
        rules.append(run.step(**{SYSTIN: 80.0}).decisions[PWM1].rule)
    assert rules[0] == "p/cpu-fan" and rules[-1] == "p/hot"  # the 10 s mean passed 70 °C on its own time
    assert run.step().decisions[PWM1].value == 90.0


def test_an_override_wins_and_its_end_ramps_from_where_it_left_the_fan():
    run = Run()
    steady = run.settle().decisions[PWM2]
    assert steady.value == pytest.approx(47.5)
    res = run.step(overrides={PWM2: 20.0})
    assert res.decisions[PWM2].layer is Layer.OVERRIDE and res.decisions[PWM2].value == 20.0
    back = [run.step().decisions[PWM2].value for _ in range(3)]
    assert back == pytest.approx([25.0, 30.0, 35.0])  # ramping up again at 5 %/s, not the kept 47.5


def test_a_pid_pinned_at_its_bound_is_kept_with_this_ticks_time_and_unpinned_by_a_new_error():
    run = Run()
    kept = run.settle().decisions[PWM2]
    res = run.step()
    assert res.decisions[PWM2] is kept
    pid = res.state.policies["p"].curves[f"case|{PWM2}|case"]
    assert (pid.integral, pid.prev_err, pid.t) == (-30.0, -5.0, run.t)  # ki 1, base 30: bound −30
    integrals = [run.step(**{SYSTIN: 50.0}).state.policies["p"].curves[f"case|{PWM2}|case"].integral
                 for _ in range(4)]
    assert integrals == pytest.approx([-25.0, -20.0, -15.0, -10.0])  # off its bound at once
    values = [run.step().decisions[PWM2].value for _ in range(12)]
    assert values[-4:] == pytest.approx([75.0, 80.0, 85.0, 90.0])  # 40 % + its integral, past the cpu curve


def test_a_pid_state_is_kept_only_pinned_at_its_bound_or_without_error():
    """A PID state equal to the one it came from is kept only where no time step can move it: a tick at the
    same time (no step) leaves an integrating PID as it was, and that is no reason to keep it."""
    policy = load_policy_text(POLICY, name="p")
    rule = next(r for r in compile_plan(policy, DEVICES).rules if r.name == "case")
    keys = rule.curve_keys[PWM2]
    pid = rule.curves["case"]
    assert pid_pinned(pid, CurveState(integral=-30.0, prev_err=-5.0, t=3.0))  # at the bound, pushing on it
    assert pid_pinned(pid, CurveState(integral=12.0, prev_err=0.0, t=3.0))  # no error
    assert not pid_pinned(pid, CurveState(integral=-30.0, prev_err=5.0, t=3.0))  # leaving the bound
    assert not pid_pinned(pid, CurveState(integral=-10.0, prev_err=-5.0, t=3.0))  # integrating
    cpu = CurveState(ref_c=50.0)
    for integral, err, kept in ((-30.0, -5.0, True), (-10.0, -5.0, False), (12.0, 0.0, True)):
        st = CurveState(integral=integral, prev_err=err, t=3.0)
        out = {keys["cpu"]: cpu, keys["case"]: st}
        states = memo.states_in(keys, out)
        assert (memo.left(rule, keys, states, out, 3.0) is not None) is kept
    out = {keys["cpu"]: CurveState(ref_c=52.0),
           keys["case"]: CurveState(integral=-30.0, prev_err=-5.0, t=3.0)}
    assert memo.left(rule, keys, memo.states_in(keys, {**out, keys["cpu"]: cpu}), out, 3.0) is None  # moved


def test_a_hold_wins_and_its_release_gives_the_rule_back():
    run = Run()
    run.settle()
    hold = load_policy_text(HOLD, name="loud")
    res = run.step(holds=[hold])
    assert res.decisions[PWM1].layer is Layer.HOLD and res.decisions[PWM1].value == 70.0
    res = run.step()
    assert res.decisions[PWM1].rule == "p/cpu-fan" and res.decisions[PWM1].value == pytest.approx(47.5)


def test_a_reload_decides_again_with_the_same_inputs():
    run = Run()
    kept = run.settle().decisions[PWM1]
    run.policy = load_policy_text(POLICY.replace("[80, 100]", "[60, 100]"), name="p")
    res = run.step()
    assert res.decisions[PWM1] is not kept and res.decisions[PWM1].value == pytest.approx(65.0)


def test_a_ramp_under_way_moves_every_tick_with_inputs_that_stand_still():
    run = Run()
    values = [run.step().decisions[PWM2].value for _ in range(5)]
    assert values == pytest.approx([30.0, 35.0, 40.0, 45.0, 47.5])


def test_a_critical_temperature_overrides_a_kept_decision_every_tick():
    run = Run()
    run.settle(**{TCTL: 97.0})
    for _ in range(3):
        res = run.step()
        assert res.decisions[PWM1].layer is Layer.SAFETY and res.decisions[PWM1].value == 100.0
        assert res.decisions[PWM1].rule == "safety/critical-temperature"


def test_random_inputs_decide_as_without_the_memory():
    rng = random.Random(7)
    run, hold = Run(), load_policy_text(HOLD, name="loud")
    for _ in range(400):
        holds = [hold] if rng.random() < 0.05 else []
        overrides = {PWM2: 10.0} if rng.random() < 0.05 else EMPTY
        values = {}
        if rng.random() < 0.3:
            values[TCTL] = rng.choice([45.0, 50.0, 55.0, 70.0, 96.0, Status.FAILED])
        if rng.random() < 0.1:
            values[SYSTIN] = rng.choice([40.0, 80.0, Status.FAILED])
        run.step(holds=holds, overrides=overrides, **values)


def test_inputs_are_built_when_read_and_the_used_channels_are_there_before():
    run = Run()
    d = run.settle().decisions[PWM1]
    assert isinstance(d.inputs, Lazy)
    assert eager_items(d.inputs) == {"used:cpu": TCTL}
    assert d.inputs == dict(d.inputs) and "curve_pct" in d.inputs and len(d.inputs) == len(dict(d.inputs))


SHARED = """
machines:
  thermal:
    per: machine
    states:
      - name: cool
      - name: hot
        enter: {metric: temperature_c, sensor: SYSTIN, stat: mean, window_s: 5, above: 70}
        exit: {metric: temperature_c, sensor: SYSTIN, stat: mean, window_s: 5, below: 60}
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 30], [80, 100]], hysteresis_c: 3}
rules:
  - {name: hot, kind: fan, fans: {id: ["*/pwm1"]}, when: {state: thermal.hot}, duty_pct: 90}
  - {name: both, kind: fan, fans: {id: ["*/pwm1", "*/pwm2"]}, curve: cpu}
"""


def test_fans_of_one_rule_share_a_curve_only_from_equal_states():
    """Two fans of one rule are worked out once while their curve states are equal; a fan whose state went
    another way (taken by an earlier rule meanwhile) gets its own."""
    run = Run(load_policy_text(SHARED, name="p"))
    res = run.settle(n=10, **{TCTL: 60.0})
    assert res.decisions[PWM1].value == res.decisions[PWM2].value == pytest.approx(65.0)
    res = run.settle(n=10, **{SYSTIN: 80.0})
    assert res.decisions[PWM1].rule == "p/hot"
    res = run.settle(n=3, **{TCTL: 58.0})  # within the hysteresis: pwm2 keeps its reference of 60 °C
    assert res.decisions[PWM2].value == pytest.approx(65.0)
    res = run.settle(n=10, **{SYSTIN: 40.0})
    assert res.decisions[PWM1].rule == "p/both"
    assert res.decisions[PWM1].value == pytest.approx(61.5)  # back with no reference: 58 °C
    assert res.decisions[PWM2].value == pytest.approx(65.0)


def test_a_fan_its_ramp_holds_back_says_so_in_its_reason():
    """explain read "curve board → 77 %" beside "curve_pct 28.8" while a ramp held the fan back (newuser8
    #5): the reason names the ramp while it limits the step, and only then."""
    run = Run()
    first = run.step().decisions[PWM2]  # from the duty read back, no time yet: no step limited
    assert first.reason == f"curve both → {first.value:.0f} %"
    up = run.step().decisions[PWM2]
    assert up.value == pytest.approx(first.value + 5.0)
    assert up.reason == (f"curve both → {up.value:.0f} % (ramping up at 5 %/s, ramp_up_pct_s; the curve asks "
                         f"{up.inputs['curve_pct']:.1f} %)")
    assert up.inputs["curve_pct"] > up.value
    settled = run.settle().decisions[PWM2]
    assert settled.reason == f"curve both → {settled.value:.0f} %"
