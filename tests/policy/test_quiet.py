"""Quiet mode through the real engine: fans held to a ceiling, power lowered first, the ceiling passed only when
power is exhausted or near danger, safety over everything.

The plant: one RTX 4090-like GPU whose temperature settles at ``base_c`` + 0.1 °C/W × its draw (τ 20 s),
drawing min(its job's demand, its limit); two board fans following a curve of the GPU's temperature
(45 % at 60 °C), each spinning 20 RPM per % of duty."""

import math

import pytest

from aithermd.model import Layer
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.quiet import ceiling_c
from aithermd.policy.schema import MixCurve, PidCurve, PointsCurve
from tests.policy.machines import K10, NCT, PKG, tick, workstation

FANS = (f"{NCT}/pwm1", f"{NCT}/pwm2")


def policy(quiet: str, limit: str = "max"):
    return load_policy_text(f"""
curves:
  board: {{kind: points, source: "gpu*/temperature", points: [[40, 30], [60, 45], [75, 75], [85, 100]]}}
rules:
  - {{name: up, kind: gpu_power_limit, limit: {limit}}}
  - {{name: board-fans, kind: fan, fans: {{chip: "nct*"}}, curve: board}}
{quiet}""", name="q")


QUIET = """
quiet:
  fans: [{fans: {chip: "nct*"}, max_duty_pct: 45}]
  approach_c: 8
  min_limit_pct: 50
  ramp_pct_s: 5
"""


def run(pol, *, base_c: float, demand_w: float = 400.0, seconds: int = 400, start_c: float | None = None,
        hold_c: float | None = None):
    devices = workstation(1)
    knobs = {"gpu0/power_limit": 450.0, **{f: 30.0 for f in FANS}}
    temp = base_c if start_c is None else start_c
    state, trace = initial_state(), []
    for t in range(seconds):
        limit = knobs["gpu0/power_limit"]
        draw = min(demand_w, limit)
        temp += (base_c + 0.1 * draw - temp) / 20.0
        reading = temp if hold_c is None else hold_c
        vals = {"gpu0/temperature": reading, "gpu0/power": draw, "gpu0/utilization": 98.0,
                **{f"{NCT}/fan{n}": 20.0 * knobs[f] for n, f in ((1, FANS[0]), (2, FANS[1]))}}
        r = evaluate(pol, (), tick(devices, float(t), vals, knobs=knobs), state)
        state = r.state
        for k in knobs:
            d = r.decisions.get(k)
            if d is not None and d.value is not None:
                knobs[k] = d.value
        trace.append((t, reading, dict(knobs), r))
    return trace


def test_the_curve_is_inverted_where_it_passes_the_ceiling():
    pts = PointsCurve(kind="points", source="x", points=[[40, 30], [60, 45], [75, 75], [85, 100]])
    assert ceiling_c(pts, {}, 45.0) == 60.0
    assert ceiling_c(pts, {}, 60.0) == 67.5
    assert ceiling_c(pts, {}, 100.0) == math.inf and ceiling_c(pts, {}, 20.0) == -math.inf
    pid = PidCurve(kind="pid", source="x", setpoint_c=70.0, kp=2.0, base_pct=30.0)
    assert ceiling_c(pid, {}, 50.0) == 80.0
    mix = MixCurve(kind="mix", fn="max", curves=["a", "b"])
    assert ceiling_c(mix, {"a": pts, "b": pid}, 45.0) == 60.0


def test_without_quiet_the_fans_follow_their_curve_above_the_ceiling():
    trace = run(policy(""), base_c=28.0)
    assert max(k[FANS[0]] for _, _, k, _ in trace[-60:]) > 60.0


def test_power_comes_down_first_and_the_fans_stay_at_their_ceiling():
    trace = run(policy(QUIET), base_c=28.0)
    assert max(k[f] for _, _, k, _ in trace for f in FANS) <= 45.0
    t, temp, knobs, r = trace[-1]
    assert knobs["gpu0/power_limit"] < 400.0  # below what the job would draw: the limit holds the heat down
    assert knobs["gpu0/power_limit"] >= 300.0  # never below min_limit_pct of the rule's 600 W
    assert 52.0 <= temp <= 60.5  # inside the band below the ceiling temperature
    d = r.decisions["gpu0/power_limit"]
    assert d.rule == "q/quiet" and "quiet: fans near their ceiling" in d.reason


def test_when_power_is_exhausted_the_fans_pass_the_ceiling():
    trace = run(policy(QUIET), base_c=40.0)  # 300 W (the lowest quiet sets) still settles at 70 °C
    t, temp, knobs, r = trace[-1]
    assert knobs["gpu0/power_limit"] == 300.0 and temp > 60.0
    assert knobs[FANS[0]] > 45.0
    assert "above its 45 % quiet ceiling: power limits at their lowest" in r.decisions[FANS[0]].reason


def test_near_the_safety_threshold_the_fans_pass_the_ceiling_at_once():
    # the GPU slows down at 90 °C: safety acts at 85, quiet lets the fans go from 75 (danger_margin_c 10)
    trace = run(policy(QUIET), base_c=28.0, hold_c=78.0, seconds=3)
    _, _, knobs, r = trace[-1]
    assert knobs["gpu0/power_limit"] > 300.0  # power has hardly started coming down
    assert knobs[FANS[0]] > 45.0 and "within 10 °C of its safety threshold" in r.decisions[FANS[0]].reason


def test_safety_overrides_quiet():
    trace = run(policy(QUIET), base_c=28.0, hold_c=86.0, seconds=2)
    _, _, knobs, r = trace[-1]
    assert r.decisions[FANS[0]].layer == Layer.SAFETY and knobs[FANS[0]] == 100.0
    # the limit is cut in proportion to how hot it is (policy/safety_latch.py), within its constraints
    assert r.decisions["gpu0/power_limit"].layer == Layer.SAFETY
    assert 150.0 <= knobs["gpu0/power_limit"] <= trace[0][2]["gpu0/power_limit"]


def test_an_rpm_ceiling_holds_the_fans_tachometer_to_it():
    quiet = QUIET.replace("max_duty_pct: 45", "max_rpm: 900")  # 20 RPM per %: 45 %
    trace = run(policy(quiet), base_c=28.0)
    late = [20.0 * k[FANS[0]] for _, _, k, _ in trace[-100:]]
    assert max(late) <= 900.0 * 1.02


@pytest.mark.parametrize("when, quiet_on", [("{schedule: {from: '00:00', to: '24:00'}}", True),
                                            ("{schedule: {days: [holiday]}}", False)])
def test_quiet_applies_only_while_its_when_holds(when, quiet_on):
    trace = run(policy(QUIET.replace("quiet:\n", f"quiet:\n  when: {when}\n")), base_c=28.0, seconds=300)
    assert (max(k[FANS[0]] for _, _, k, _ in trace) <= 45.0) is quiet_on


def fixed(quiet: str, rule_extra: str = ""):
    return load_policy_text(f"""
rules:
  - {{name: up, kind: gpu_power_limit, limit: max}}
  - {{name: f, kind: fan, fans: {{chip: "nct*"}}, duty_pct: 60{rule_extra}}}
{quiet}""", name="q")


def _fans_at(pol, values, t=0.0):
    r = evaluate(pol, (), tick(workstation(1), t, values, knobs={f: 30.0 for f in FANS}), initial_state())
    return [r.decisions[f].value for f in FANS], r


COOL = {"gpu0/temperature": 45.0, "gpu0/power": 300.0, "gpu0/utilization": 98.0, f"{K10}/temp1": 60.0,
        f"{NCT}/temp1": 35.0, f"{NCT}/fan1": 900.0, f"{NCT}/fan2": 900.0}


def test_a_quiet_ceiling_never_takes_a_fan_below_its_rules_minimum_duty():
    """attack4 B3: a ceiling of 0 % over a rule with min_duty_pct 40 stopped every board fan."""
    pol = fixed("quiet: {fans: [{fans: {chip: 'nct*'}, max_duty_pct: 0}]}", ", min_duty_pct: 40")
    duties, r = _fans_at(pol, COOL)
    assert duties == [40.0, 40.0]
    assert "quiet ceiling 0 %, held at the rule's minimum duty 40 %" in r.decisions[FANS[0]].reason


def test_a_fixed_duty_fan_under_quiet_escapes_when_any_watched_temperature_nears_danger():
    """attack4 B3: a fixed duty reads no temperature, so nothing ever let its fans pass the ceiling (CPU at
    129 °C, case air at 75 °C in the simulator). Held while everything is cool; released when the CPU's
    Tctl (k10temp: no threshold of its own, the AMD default) or the GPU comes within danger_margin_c."""
    pol = fixed("quiet: {fans: [{fans: {chip: 'nct*'}, max_duty_pct: 20}]}")
    assert _fans_at(pol, COOL)[0] == [20.0, 20.0]
    hot_cpu = {**COOL, f"{K10}/temp1": 102.0}  # trigger 115 - 5 = 110 °C; danger from 100 °C
    duties, r = _fans_at(pol, hot_cpu)
    assert duties == [60.0, 60.0]
    assert f"{K10}/temp1 within 10 °C of its safety threshold" in r.decisions[FANS[0]].reason
    assert _fans_at(pol, {**COOL, "gpu0/temperature": 77.0})[0] == [60.0, 60.0]  # the GPU's slowdown 90: 85 - 10


def test_an_amd_cpu_without_a_threshold_of_its_own_is_critical_over_the_default():
    """k10temp on Zen exports no crit: a Tctl of 120 °C drove nothing (attack4 B3). Over
    CPU_DEFAULT_THRESHOLD_C − margin the package limits are cut, whatever the policy asks."""
    from aithermd.policy.safety import CPU_DEFAULT_THRESHOLD_C

    pol = fixed("")
    _, r = _fans_at(pol, {**COOL, f"{K10}/temp1": CPU_DEFAULT_THRESHOLD_C - 5.0 + 1.0})
    assert r.decisions[f"{PKG}/pl1"].layer == Layer.SAFETY and r.decisions[f"{PKG}/pl1"].value == 10.0
    _, r = _fans_at(pol, {**COOL, f"{K10}/temp1": 105.0})  # a Ryzen 5000 H laptop at its Tjmax: not critical
    assert f"{PKG}/pl1" not in r.decisions or r.decisions[f"{PKG}/pl1"].layer != Layer.SAFETY


def test_a_critical_cpu_cuts_a_package_without_a_minimum_and_runs_every_board_fan_full():
    """attack5 C11: intel_rapl exports no min_power_uw, so the critical cut of PL1/PL2 had no value and was
    never written; board fans on a fixed duty (no curve reading the CPU) stayed at 20 % while the simulated
    package passed 160 °C, with not a log line."""
    from aithermd.model import Device, Knob
    from aithermd.policy.safety import CPU_DEFAULT_THRESHOLD_C, PACKAGE_FLOOR_W
    from tests.policy.machines import gpu, k10temp, nct, rapl

    bare = rapl()
    no_min = Device(bare.id, bare.kind, bare.name, bare.channels,
                    tuple(Knob(k.id, k.device_id, k.kind, k.unit, None, 4090.0, 4090.0, True) for k in bare.knobs))
    devices = (gpu(0), nct(), k10temp(), no_min)
    pol = fixed("")
    hot = {**COOL, f"{K10}/temp1": CPU_DEFAULT_THRESHOLD_C - 4.0}  # over the AMD default threshold − 5
    r = evaluate(pol, (), tick(devices, 0.0, hot, knobs={f: 20.0 for f in FANS}), initial_state())
    assert r.decisions[f"{PKG}/pl1"].layer == Layer.SAFETY and r.decisions[f"{PKG}/pl1"].value == PACKAGE_FLOOR_W
    assert r.decisions[f"{PKG}/pl2"].value == PACKAGE_FLOOR_W
    assert [(r.decisions[f].layer, r.decisions[f].value) for f in FANS] == [(Layer.SAFETY, 100.0)] * 2


def test_a_fixed_duty_fans_danger_escape_is_held_so_its_fans_start_at_most_12_times_an_hour():
    """attack5 C2: under a 0 % ceiling with no minimum duty, the escape was decided per tick — the fans ran at
    60 % until the CPU cooled under the danger line, stopped, and started again a few seconds later (145
    stop/starts in 30 simulated minutes). An hour on the fake clock of a CPU heading for 112 °C with its
    fans stopped and 88 °C under them (danger from 100 °C): each escape now lasts until every source has
    been 5 °C under its line for 300 s."""
    pol = fixed("quiet: {fans: [{fans: {chip: 'nct*'}, max_duty_pct: 0}]}")
    devices, knobs, state = workstation(1), {f: 0.0 for f in FANS}, initial_state()
    tctl, duties = 95.0, []
    for t in range(3600):
        tctl += ((88.0 if knobs[FANS[0]] > 0 else 112.0) - tctl) / 20.0
        r = evaluate(pol, (), tick(devices, float(t), {**COOL, f"{K10}/temp1": tctl}, knobs=knobs), state)
        state = r.state
        knobs.update({f: r.decisions[f].value for f in FANS})
        duties.append(knobs[FANS[0]])
    starts = sum(1 for a, b in zip(duties, duties[1:], strict=False) if a == 0.0 < b)
    assert 2 <= starts <= 12, starts  # it does escape, and stops and starts again, but at most 12 times
    assert max(duties) == 60.0 and min(duties[60:]) == 0.0
