"""Closed loop: the real daemon, its shipped policies and the simulated workstation, end to end.

The simulated sensors are noisy as real ones are (:mod:`aithermd.sim.sensor_noise`: GPU temperatures scatter
by about 2 °C from one reading to the next under load), so the fan test below can fail: a policy whose curve
follows every reading makes its fans hunt, and ``test_a_curve_without_hysteresis_or_ramp_limits_hunts``
shows that it does (the shipped policies smooth the curve's input with ``smoothing_s`` instead).
"""

import collections
import re
from pathlib import Path

import pytest

from aithermd.policy.loader import load_policy_text
from tests.sim.conftest import POLICIES, long_training_load, run_daemon

STEADY_MINUTES = range(12, 26)  # minutes 12–25 of the long run: training, past the thermal transient
MAX_CHANGES_PER_MINUTE = 6
SHIPPED = Path(__file__).resolve().parents[2] / "policies"


def worst_fan_changes_per_minute(run: dict) -> int:
    """The most duty changes one fan made in one minute of :data:`STEADY_MINUTES`."""
    per_minute: collections.Counter = collections.Counter()
    fans = set()
    for a in run["actuations"]:
        if "/pwm" in a["knob"] or "/fan" in a["knob"]:
            fans.add(a["knob"])
            per_minute[(a["knob"], int(a["t_s"] // 60))] += 1
    assert fans, f"{run['policy']} controls no fan: nothing to test"
    return max(per_minute[(fan, minute)] for fan in fans for minute in STEADY_MINUTES)


@pytest.mark.parametrize("policy", POLICIES)
def test_temperatures_stay_below_the_slowdown_threshold(policy, default_cycle_runs, long_training_runs):
    for run in (default_cycle_runs[policy], long_training_runs[policy]):
        for name, gpu in run["gpus"].items():
            assert gpu["peak_temp_c"] < gpu["slowdown_temp_c"], f"{policy} {name}"
            assert gpu["slowdown_s"] == 0, f"{policy} {name} hit the driver's thermal slowdown"
        assert run["peak_cpu_c"] < 90  # k10temp Tctl's throttle point on Zen 2 is 95 °C


@pytest.mark.parametrize("policy", POLICIES)
def test_fan_duty_changes_at_most_6_times_a_minute_in_steady_state(policy, long_training_runs):
    assert worst_fan_changes_per_minute(long_training_runs[policy]) <= MAX_CHANGES_PER_MINUTE


def test_a_curve_without_hysteresis_or_ramp_limits_hunts(tmp_path):
    """The same check on ``balanced`` stripped of its input smoothing, hysteresis and ramp limits, on the
    same noisy machine: it must fail, or the check above could not catch a policy that hunts."""
    text = (SHIPPED / "balanced.yaml").read_text()
    bad = re.sub(r"\n *(smoothing_s|hysteresis_c|ramp_up_pct_s|ramp_down_pct_s):[^\n]*", "", text)
    doc = load_policy_text(bad, name="no-hysteresis").document
    assert doc.curves["board"].hysteresis_c == 0 and doc.curves["board"].smoothing_s == 0
    assert all(getattr(r, "ramp_up_pct_s", None) is None and getattr(r, "ramp_down_pct_s", None) is None
               for r in doc.rules)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "no-hysteresis.yaml").write_text(bad)
    run = run_daemon(tmp_path, "no-hysteresis", 1920, long_training_load(),
                     policy_dirs=[tmp_path / "policies"]).data
    worst = worst_fan_changes_per_minute(run)
    print(f"balanced without smoothing, hysteresis or ramp limits: {worst} fan duty changes in its worst "
          "steady minute")
    assert worst > 2 * MAX_CHANGES_PER_MINUTE


def test_policies_take_the_board_fans_under_control(long_training_runs):
    for policy, run in long_training_runs.items():
        knobs = {a["knob"] for a in run["actuations"]}
        assert any(k.startswith("hwmon:nct6798-isa-0290/pwm") for k in knobs), policy


def test_balanced_does_more_work_per_joule_than_the_stock_default_limit(default_cycle_runs):
    balanced, stock = default_cycle_runs["balanced"], default_cycle_runs["stock"]
    assert balanced["work_per_kj"] > stock["work_per_kj"]
    assert balanced["gpu_energy_j"] < stock["gpu_energy_j"]


def test_a_limit_above_the_default_buys_no_work_a_job_cannot_use(default_cycle_runs):
    """ai-training raises the 4090 to its 600 W maximum; the job draws well under its 450 W default
    (calibrated on the Zeus sweeps and the real traces), so it gets at most the last percent or two the
    default still clipped off its peaks, and never less than stock."""
    run, stock = default_cycle_runs["ai-training"], default_cycle_runs["stock"]
    gpu = run["gpus"]["gpu0"]
    assert gpu["max_limit_w"] > gpu["default_limit_w"]
    assert any(c[2] == gpu["max_limit_w"] for c in gpu["limit_changes"])  # it went to the maximum
    work, stock_work = gpu["work"], stock["gpus"]["gpu0"]["work"]
    assert stock_work * 0.999 <= work <= stock_work * 1.02
    assert gpu["stock_work"] == pytest.approx(stock_work, rel=0.01)  # the twin is the stock run


@pytest.mark.parametrize("policy", ["balanced", "ai-training"])
def test_limits_rise_under_load_and_relax_when_idle(policy, default_cycle_runs):
    changes = default_cycle_runs[policy]["gpus"]["gpu0"]["limit_changes"]
    relaxed = [c for c in changes if c[2] < 450]
    raised = [c for c in changes if c[2] >= 450 and c[1] < c[2]]
    assert relaxed and raised
    assert any(120 <= c[0] <= 120 + 40 for c in raised)  # within its sustain window (+ a tick) of the load
    assert any(c[0] >= 480 for c in relaxed)  # and back down after the load ends


def test_policy_states_are_reported(default_cycle_runs):
    states = default_cycle_runs["ai-training"]["policy_states_s"]
    assert set(states["ai-training/gpu0"]) == {"idle", "training"}
    assert sum(states["ai-training/gpu0"].values()) == pytest.approx(600, abs=2)
