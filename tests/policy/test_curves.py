"""Fan curves: interpolation, hysteresis, PID, mix, and fan shaping (min, start, stop, ramps)."""

from __future__ import annotations

import pytest

from aithermd.policy import curves as fc
from aithermd.policy.schema import MixCurve, PidCurve, PointsCurve

PTS = PointsCurve(kind="points", source="Tctl", points=[(30, 20), (60, 50), (80, 100)], hysteresis_c=3)


@pytest.mark.parametrize("temp, duty", [(10, 20), (30, 20), (45, 35), (60, 50), (70, 75), (80, 100), (99, 100)])
def test_interpolation_is_linear_and_flat_beyond_the_ends(temp, duty):
    assert fc.interpolate(PTS.points, temp) == pytest.approx(duty)


def test_hysteresis_follows_rises_at_once_and_falls_only_past_the_deadband():
    st = fc.CurveState()
    out = []
    for temp in (50, 60, 58, 57.5, 57, 56, 62):
        duty, st = fc.points_step(PTS, temp, st)
        out.append(round(duty, 2))
    assert out == [40.0, 50.0, 50.0, 50.0, 47.0, 47.0, 55.0]


def test_pid_pushes_up_when_hot_and_integrates_without_winding_up():
    pid = PidCurve(kind="pid", source="x", setpoint_c=70, kp=2, ki=0.5, kd=0, base_pct=30)
    st = fc.CurveState()
    duty, st = fc.pid_step(pid, 70, 0.0, st)
    assert duty == 30.0
    duty, st = fc.pid_step(pid, 80, 1.0, st)
    assert duty == pytest.approx(30 + 2 * 10 + 0.5 * 10)
    for t in range(2, 1000):
        duty, st = fc.pid_step(pid, 100, float(t), st)
    assert duty == 100.0
    assert st.integral <= (100 - 30) / 0.5
    duty, st = fc.pid_step(pid, 60, 1000.0, st)  # anti-windup: comes down at once
    assert duty < 100.0


@pytest.mark.parametrize("temp", [float("-inf"), float("inf"), float("nan")])
def test_pid_on_a_nonsense_temperature_is_full_duty_and_keeps_its_state(temp):
    """A non-finite source (found by the policy fuzz test: -inf gave a NaN duty) drives the fan to 100 %."""
    pid = PidCurve(kind="pid", source="x", setpoint_c=70, kp=2, ki=0.5, kd=0, base_pct=30)
    _, st = fc.pid_step(pid, 75, 0.0, fc.CurveState())
    duty, after = fc.pid_step(pid, temp, 0.0, st)
    assert duty == 100.0 and after == st
    duty, _ = fc.pid_step(pid, 75, 1.0, after)
    assert duty == pytest.approx(30 + 2 * 5 + 0.5 * 5), "the next good reading picks up where it was"


def test_mix_takes_max_min_or_mean_of_named_curves():
    a = PointsCurve(kind="points", source="a", points=[(0, 10), (100, 10)])
    b = PointsCurve(kind="points", source="b", points=[(0, 50), (100, 50)])
    curves = {"a": a, "b": b}
    for fn, expected in (("max", 50), ("min", 10), ("mean", 30)):
        mix = MixCurve(kind="mix", fn=fn, curves=["a", "b"])
        out: dict = {}
        assert fc.evaluate("m", mix, curves, {"a": 40, "b": 40}, 0.0, {}, out) == expected
    assert fc.evaluate("m", MixCurve(kind="mix", curves=["a", "b"]), curves, {"a": 40}, 0.0, {}, {}) is None


def test_shape_min_duty_stop_below_and_start_kick():
    assert fc.shape(5, 50, 0.0, fc.FanState(30, -1), min_duty_pct=25) == 25
    assert fc.shape(40, 30, 0.0, fc.FanState(30, -1), min_duty_pct=25, stop_below_c=35) == 0
    assert fc.shape(30, 50, 0.0, fc.FanState(0.0, -1), start_duty_pct=60) == 60
    assert fc.shape(70, 50, 0.0, fc.FanState(0.0, -1), start_duty_pct=60) == 70


def test_shape_ramp_limits_per_second():
    prev = fc.FanState(50.0, 10.0)
    assert fc.shape(100, 70, 12.0, prev, ramp_up_pct_s=10) == 70.0
    assert fc.shape(0, 70, 12.0, prev, ramp_down_pct_s=2, min_duty_pct=0) == 46.0
    assert fc.shape(100, 70, 12.0, prev) == 100.0
    assert fc.shape(60, 70, 12.0, fc.FanState(None, None), ramp_up_pct_s=1) == 60.0
