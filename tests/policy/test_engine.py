"""The engine: rule kinds, first-rule-wins, state machines with hysteresis, layers and purity."""

from __future__ import annotations

import textwrap

import pytest

from aithermd.model import Layer, Status
from aithermd.policy.engine import evaluate, initial_state, needs_processes
from aithermd.policy.loader import load_policy_text
from tests.policy.machines import (
    NCT,
    PKG,
    datacenter_gpu,
    gpu,
    gpu_values,
    k10temp,
    nct,
    rapl,
    tick,
    workstation,
)


def pol(text: str, name: str = "t"):
    return load_policy_text(textwrap.dedent(text), name=name)


def run(policy, devices, series, holds=(), overrides=None, state=None):
    """Evaluate a series of (t, values[, kwargs]) ticks; return the list of results."""
    state = state or initial_state()
    out = []
    for item in series:
        t, values = item[0], item[1]
        kw = item[2] if len(item) > 2 else {}
        res = evaluate(policy, holds, tick(devices, t, values, **kw), state, overrides or {})
        state = res.state
        out.append(res)
    return out


GPU_LIMIT = """
rules:
  - {name: r, kind: gpu_power_limit, limit: LIMIT}
"""


@pytest.mark.parametrize("limit, expected", [("300", 300.0), ("'300 W'", 300.0), ("80%", 360.0),
                                             ("default", 450.0), ("min", 150.0), ("max", 600.0),
                                             ("1000", 600.0), ("20%", 150.0)])
def test_gpu_power_limit_values_are_resolved_and_clamped(limit, expected):
    p = pol(GPU_LIMIT.replace("LIMIT", limit))
    [res] = run(p, [gpu(0)], [(0.0, gpu_values(0, 0, 30))])
    d = res.decisions["gpu0/power_limit"]
    assert d.value == expected
    assert d.layer == Layer.POLICY and d.rule == "t/r"
    assert d.requested is not None and d.requested >= 0


def test_requested_keeps_the_value_before_clamping():
    p = pol(GPU_LIMIT.replace("LIMIT", "1000"))
    [res] = run(p, [gpu(0)], [(0.0, {})])
    d = res.decisions["gpu0/power_limit"]
    assert (d.requested, d.value) == (1000.0, 600.0)


def test_max_on_a_datacenter_gpu_is_its_default():
    p = pol(GPU_LIMIT.replace("LIMIT", "max"))
    [res] = run(p, [datacenter_gpu(0)], [(0.0, {})])
    assert res.decisions["gpu0/power_limit"].value == 700.0


def test_gpu_selectors_by_index_uuid_and_model():
    p = pol("""
        rules:
          - {name: one, kind: gpu_power_limit, gpus: 1, limit: 300}
          - {name: uuid, kind: gpu_power_limit, gpus: {uuid: "gpu-00000002-*"}, limit: 310}
          - {name: h100, kind: gpu_power_limit, gpus: {model: "*H100*"}, limit: 320}
        """)
    devices = [gpu(0), gpu(1), gpu(2), datacenter_gpu(3)]
    [res] = run(p, devices, [(0.0, {})])
    values = {k: d.value for k, d in res.decisions.items() if k.endswith("power_limit")}
    assert values == {"gpu1/power_limit": 300.0, "gpu2/power_limit": 310.0, "gpu3/power_limit": 320.0}


def test_first_matching_rule_wins_and_when_false_falls_through():
    p = pol("""
        rules:
          - name: hot
            kind: gpu_power_limit
            when: {metric: gpu.temperature_c, stat: last, above: 80}
            limit: 200
          - {name: base, kind: gpu_power_limit, limit: 400}
          - {name: never, kind: gpu_power_limit, limit: 500}
        """)
    cool, hot = run(p, [gpu(0)], [(0.0, gpu_values(0, 0, 30, temp=60)), (1.0, gpu_values(0, 0, 30, temp=82))])
    assert (cool.decisions["gpu0/power_limit"].value, cool.decisions["gpu0/power_limit"].rule) == (400.0, "t/base")
    assert (hot.decisions["gpu0/power_limit"].value, hot.decisions["gpu0/power_limit"].rule) == (200.0, "t/hot")


def test_knobs_no_rule_decides_are_absent():
    p = pol("""
        rules:
          - name: never
            kind: gpu_power_limit
            when: {metric: gpu.temperature_c, stat: last, above: 200}
            limit: 200
        """)
    [res] = run(p, [gpu(0)], [(0.0, gpu_values(0, 0, 30))])
    assert dict(res.decisions) == {}


def test_cpu_power_limit_sets_pl1_and_pl2_on_package_zones():
    p = pol("""
        rules:
          - {name: cpu, kind: cpu_power_limit, pl1_w: 95, pl2_w: 400}
        """)
    [res] = run(p, [rapl()], [(0.0, {})])
    assert res.decisions[f"{PKG}/pl1"].value == 95.0
    assert res.decisions[f"{PKG}/pl2"].value == 300.0  # clamped to the zone's maximum
    assert res.decisions[f"{PKG}/pl2"].requested == 400.0


def test_fan_rule_fixed_duty_and_label_selector():
    p = pol("""
        rules:
          - {name: cpu-fan, kind: fan, fans: {label: cpu_fan}, duty_pct: 40}
        """)
    [res] = run(p, [nct()], [(0.0, {})])
    assert {k: d.value for k, d in res.decisions.items()} == {f"{NCT}/pwm1": 40.0}


CURVE = """
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 20], [80, 100]]}
rules:
  - {name: fans, kind: fan, fans: {chip: "nct*"}, curve: cpu}
"""


def test_fan_curve_follows_its_source_temperature():
    p = pol(CURVE)
    devices = [nct(), k10temp()]
    results = run(p, devices, [(0.0, {"hwmon:k10temp-pci-00c3/temp1": 60.0}),
                               (1.0, {"hwmon:k10temp-pci-00c3/temp1": 90.0})])
    assert results[0].decisions[f"{NCT}/pwm1"].value == pytest.approx(60.0)
    assert results[1].decisions[f"{NCT}/pwm2"].value == 100.0
    assert results[0].decisions[f"{NCT}/pwm1"].inputs["source:cpu"] == 60.0


def test_failed_fan_source_sends_the_fan_to_full_never_zero():
    p = pol(CURVE)
    devices = [nct(), k10temp()]
    for status in (Status.FAILED, Status.IMPLAUSIBLE, Status.STALE, Status.NOT_SUPPORTED):
        [res] = run(p, devices, [(0.0, {"hwmon:k10temp-pci-00c3/temp1": status})])
        d = res.decisions[f"{NCT}/pwm1"]
        assert (d.value, d.layer, d.rule) == (100.0, Layer.SAFETY, "safety/failed-source")
    [res] = run(p, devices, [(0.0, {})])  # no reading at all
    assert res.decisions[f"{NCT}/pwm2"].value == 100.0


def test_needs_processes():
    assert not needs_processes([pol(CURVE)])
    assert needs_processes([pol("""
        rules:
          - {name: r, kind: gpu_power_limit, when: {process: "torchrun*"}, limit: max}
        """)])


def test_process_condition_matches_names_and_command_lines():
    p = pol("""
        rules:
          - name: train
            kind: gpu_power_limit
            when: {process: ["torchrun*", "python* -m torch.distributed*"]}
            limit: max
        """)
    results = run(p, [gpu(0)], [
        (0.0, {}, {"processes": frozenset({"bash", "python3"})}),
        (1.0, {}, {"processes": frozenset({"python3 -m torch.distributed.run train.py"})}),
        (2.0, {}, {"processes": frozenset({"torchrun"})}),
    ])
    assert [("gpu0/power_limit" in r.decisions) for r in results] == [False, True, True]


MACHINE = """
machines:
  load:
    states:
      - name: idle
        enter: {metric: gpu.utilization_pct, stat: max, window_s: 10, below: 10}
      - name: busy
        enter: {metric: gpu.utilization_pct, stat: mean, window_s: 5, above: 50}
        exit: {metric: gpu.utilization_pct, stat: max, window_s: 10, below: 10}
        min_dwell_s: DWELL
rules:
  - {name: busy, kind: gpu_power_limit, when: {state: load.busy}, limit: max}
  - {name: idle, kind: gpu_power_limit, when: {state: load.idle}, limit: 70%}
"""


def _states(results, policy="t", scope="gpu0"):
    return [r.states[policy][scope] for r in results]


def _limits(results):
    return [r.decisions["gpu0/power_limit"].value if "gpu0/power_limit" in r.decisions else None for r in results]


def test_machine_starts_unsettled_and_moves_only_once_a_window_has_held():
    p = pol(MACHINE.replace("DWELL", "0"))
    series = [(float(t), gpu_values(0, 0, 30)) for t in range(12)]
    results = run(p, [gpu(0)], series)
    limits = _limits(results)
    # the idle window (10 s) needs a sample at or before t-10: first at t=10
    assert limits[:10] == [None] * 10
    assert limits[10:] == [315.0, 315.0]


def test_enter_threshold_edge_is_inclusive_and_exit_exclusive():
    p = pol(MACHINE.replace("DWELL", "0"))
    series = [(float(t), gpu_values(0, 50.0 if t >= 1 else 0.0, 30)) for t in range(7)]
    results = run(p, [gpu(0)], series)
    # mean over (t-5, t] reaches exactly 50 at t=5 (samples 1..5 are 50): above is ≥
    assert _states(results)[4] == "idle" and _states(results)[5] == "busy"
    assert _limits(results)[5] == 600.0


def test_noisy_load_never_flaps_within_the_exit_window():
    p = pol(MACHINE.replace("DWELL", "0"))
    util = [90, 90, 90, 90, 90, 90, 0, 0, 0, 0, 0, 0, 0, 0, 0, 90, 90, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    results = run(p, [gpu(0)], [(float(t), gpu_values(0, u, 300 if u else 30)) for t, u in enumerate(util)])
    states = _states(results)
    first_busy = states.index("busy")
    # busy from t=5; dips of 9 s (< the 10 s exit window) never leave it; 10 s after the last load sample it does
    assert first_busy == 5
    assert all(s == "busy" for s in states[first_busy:26])
    assert states[26] == "idle"


def test_min_dwell_holds_the_state():
    p = pol(MACHINE.replace("DWELL", "30"))
    util = [90] * 6 + [0] * 40
    results = run(p, [gpu(0)], [(float(t), gpu_values(0, u, 300 if u else 30)) for t, u in enumerate(util)])
    states = _states(results)
    assert states.index("busy") == 5
    # exit holds from t=15 (10 s of idle) but busy must last 30 s: it leaves at t=35
    assert states[34] == "busy" and states[35] == "idle"


def test_per_gpu_machines_are_independent():
    p = pol(MACHINE.replace("DWELL", "0"))
    devices = [gpu(0), gpu(1)]
    series = [(float(t), {**gpu_values(0, 95, 400), **gpu_values(1, 0, 30)}) for t in range(12)]
    res = run(p, devices, series)[-1]
    assert dict(res.states["t"]) == {"gpu0": "busy", "gpu1": "idle"}
    assert res.decisions["gpu0/power_limit"].value == 600.0
    assert res.decisions["gpu1/power_limit"].value == 315.0
    assert "load.busy" in res.decisions["gpu0/power_limit"].reason


def test_three_states_escalate_to_the_highest_and_step_down_one_at_a_time():
    p = pol("""
        machines:
          m:
            per: machine
            states:
              - {name: low}
              - name: mid
                enter: {metric: cpu.utilization_pct, stat: last, above: 30}
                exit: {metric: cpu.utilization_pct, stat: last, below: 20}
              - name: high
                enter: {metric: cpu.utilization_pct, stat: last, above: 70}
                exit: {metric: cpu.utilization_pct, stat: last, below: 60}
        rules: []
        """)
    util = [10, 90, 65, 50, 10, 10, 25]
    results = run(p, [gpu(0), *workstation(0)], [(float(t), {"cpu/utilization": u}) for t, u in enumerate(util)])
    assert [r.states["t"]["machine"] for r in results] == ["low", "high", "high", "mid", "low", "low", "low"]


def test_sustain_s_needs_the_condition_held_continuously():
    p = pol("""
        rules:
          - name: r
            kind: gpu_power_limit
            when: {metric: gpu.utilization_pct, stat: last, above: 50, sustain_s: 3}
            limit: max
        """)
    util = [90, 90, 90, 90, 0, 90, 90, 90, 90]
    results = run(p, [gpu(0)], [(float(t), gpu_values(0, u, 30)) for t, u in enumerate(util)])
    assert [("gpu0/power_limit" in r.decisions) for r in results] == \
        [False, False, False, True, False, False, False, False, True]


def test_layers_safety_over_override_over_hold_over_policy():
    base = pol(GPU_LIMIT.replace("LIMIT", "400"), name="base")
    hold = pol(GPU_LIMIT.replace("LIMIT", "300"), name="hold")
    devices = [gpu(0)]
    [res] = run(base, devices, [(0.0, gpu_values(0, 0, 30))], holds=[hold])
    assert (res.decisions["gpu0/power_limit"].value, res.decisions["gpu0/power_limit"].layer) == (300.0, Layer.HOLD)
    [res] = run(base, devices, [(0.0, gpu_values(0, 0, 30))], holds=[hold], overrides={"gpu0/power_limit": 9999})
    d = res.decisions["gpu0/power_limit"]
    assert (d.value, d.requested, d.layer, d.rule) == (600.0, 9999.0, Layer.OVERRIDE, "override")
    [res] = run(base, devices, [(0.0, gpu_values(0, 0, 30, temp=88))], holds=[hold],
                overrides={"gpu0/power_limit": 500})
    d = res.decisions["gpu0/power_limit"]
    assert (d.value, d.layer, d.rule) == (150.0, Layer.SAFETY, "safety/critical-temperature")


def test_later_hold_wins_over_an_earlier_one():
    base = pol(GPU_LIMIT.replace("LIMIT", "400"), name="base")
    h1 = pol(GPU_LIMIT.replace("LIMIT", "300"), name="h1")
    h2 = pol(GPU_LIMIT.replace("LIMIT", "350"), name="h2")
    [res] = run(base, [gpu(0)], [(0.0, {})], holds=[h1, h2])
    assert res.decisions["gpu0/power_limit"].rule == "h2/r"
    assert set(res.states) == {"base", "h1", "h2"}


def test_evaluate_is_pure():
    p = pol(MACHINE.replace("DWELL", "0"))
    devices = [gpu(0)]
    state = initial_state()
    for t in range(8):
        state = evaluate(p, (), tick(devices, float(t), gpu_values(0, 90, 300)), state).state
    inp = tick(devices, 8.0, gpu_values(0, 0, 30))
    a = evaluate(p, (), inp, state)
    b = evaluate(p, (), inp, state)
    assert a.decisions == b.decisions and a.state.policies == b.state.policies
    assert dict(a.state.windows) == dict(b.state.windows)


def test_unknown_override_knobs_are_ignored_and_devices_can_change():
    p = pol(GPU_LIMIT.replace("LIMIT", "400"))
    [res] = run(p, [gpu(0)], [(0.0, {})], overrides={"gpu9/power_limit": 100})
    assert set(res.decisions) == {"gpu0/power_limit"}
    state = res.state
    res2 = evaluate(p, (), tick([gpu(0), gpu(1)], 1.0, {}), state)  # a GPU appears: the plan is rebuilt
    assert set(res2.decisions) == {"gpu0/power_limit", "gpu1/power_limit"}


def test_nan_and_missing_readings_never_crash():
    p = pol(MACHINE.replace("DWELL", "0"))
    devices = [gpu(0), nct(), k10temp(), rapl()]
    series = [(0.0, {"gpu0/utilization": float("nan"), "gpu0/power": None}),
              (1.0, {"gpu0/utilization": Status.FAILED, "gpu0/temperature": Status.IMPLAUSIBLE}),
              (2.0, {})]
    results = run(p, devices, series)
    assert all(r.decisions.get("gpu0/power_limit") is None for r in results)


def test_a_reloaded_policy_keeps_its_states_and_survives_fewer_states():
    three = pol("""
        machines:
          m:
            per: machine
            states:
              - {name: a}
              - {name: b, enter: {metric: cpu.utilization_pct, stat: last, above: 30}}
              - {name: c, enter: {metric: cpu.utilization_pct, stat: last, above: 70}}
        rules: []
        """)
    two = pol("""
        machines:
          m:
            per: machine
            states:
              - {name: a}
              - {name: b, enter: {metric: cpu.utilization_pct, stat: last, above: 30}}
        rules: []
        """)
    devices = [gpu(0), *workstation(0)]
    res = evaluate(three, (), tick(devices, 0.0, {"cpu/utilization": 90.0}), initial_state())
    assert res.states["t"]["machine"] == "c"
    res = evaluate(two, (), tick(devices, 1.0, {"cpu/utilization": 90.0}), res.state)
    assert res.states["t"]["machine"] == "b"


def test_sustain_timers_inside_any_keep_running_while_another_branch_holds():
    p = pol("""
        rules:
          - name: r
            kind: gpu_power_limit
            when:
              any:
                - {metric: cpu.utilization_pct, stat: last, above: 50}
                - {metric: gpu.utilization_pct, stat: last, above: 50, sustain_s: 2}
            limit: max
        """)
    devices = [gpu(0), *workstation(0)]
    # both hold from t=0; the cpu branch stops at t=3: the gpu branch has held since t=0, so the rule holds
    cpu = [90.0, 90.0, 90.0, 0.0, 0.0]
    series = [(float(t), {"cpu/utilization": c, "gpu0/utilization": 90.0}) for t, c in enumerate(cpu)]
    assert [("gpu0/power_limit" in r.decisions) for r in run(p, devices, series)] == [True] * 5


def test_a_decision_explains_itself_with_its_rule_state_and_window_statistics():
    p = pol(MACHINE.replace("DWELL", "0"), name="lab")
    results = run(p, [gpu(0)], [(float(t), gpu_values(0, 80.0, 300)) for t in range(6)])
    d = results[5].decisions["gpu0/power_limit"]  # busy once the 5 s mean held
    assert (d.rule, d.layer, d.requested, d.value) == ("lab/busy", Layer.POLICY, 600.0, 600.0)
    assert d.reason == "gpu0 in load.busy: the maximum (600 W)"
    assert d.inputs == {"gpu.utilization_pct.mean_5s": 80.0, "state:load": "busy"}


def test_the_front_of_evaluate_is_worked_out_again_only_when_the_policies_or_devices_change(monkeypatch):
    """The plans, sampler, safety plan and fan knob ids are kept while the active policy, the holds and the
    device tuple are the very same; a hold added or dropped, a reloaded policy or new devices rebuild them,
    and every tick decides what a state without the kept front decides."""
    import dataclasses

    from aithermd.policy import engine

    built = []
    real = engine._front
    monkeypatch.setattr(engine, "_front", lambda *a: built.append(a[2]) or real(*a))
    base = pol(GPU_LIMIT.replace("LIMIT", "400"), name="base")
    hold = pol(GPU_LIMIT.replace("LIMIT", "300"), name="hold")
    one, two = (gpu(0),), (gpu(0), gpu(1))
    steps = [(base, (), one)] * 3 + [(base, (hold,), one)] * 2 + [(base, (), one)] * 2 + [
        (pol(GPU_LIMIT.replace("LIMIT", "400"), name="base"), (), one)] * 2 + [(base, (), two)] * 2
    state = initial_state()
    layers = []
    for t, (active, holds, devices) in enumerate(steps):
        inp = tick(devices, float(t), gpu_values(0, 0, 30))
        cold = evaluate(active, list(holds), inp, dataclasses.replace(state, front=None))
        res = evaluate(active, list(holds), inp, state)
        assert dict(res.decisions) == dict(cold.decisions), t
        state = res.state
        layers.append(res.decisions["gpu0/power_limit"].layer)
    assert layers[:3] == [Layer.POLICY] * 3
    assert layers[3:5] == [Layer.HOLD] * 2 and layers[5:] == [Layer.POLICY] * 6
    assert "gpu1/power_limit" in res.decisions
    # once per change (the first tick, the hold added, dropped, the reloaded policy, the new devices), plus
    # once per tick for the cold evaluations
    assert len(built) - len(steps) == 5
