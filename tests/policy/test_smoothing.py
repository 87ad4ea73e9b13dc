"""A fan curve's ``smoothing_s``: the curve reads the time-weighted mean of its source over that many seconds,
while a failed source and a critical temperature still act at once on the raw reading."""

from __future__ import annotations

import random
import textwrap

import pytest

from aithermd.errors import PolicyErrors
from aithermd.model import Layer, Status
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.windows import Window
from tests.policy.machines import K10, NCT, k10temp, nct, tick

TCTL = f"{K10}/temp1"
PWM = f"{NCT}/pwm1"
# duty = temperature − 20 between 40 and 80 °C: the duty shows the temperature the curve read
POLICY = """
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 20], [80, 60]], smoothing_s: SMOOTH}
rules:
  - {name: fans, kind: fan, fans: {chip: "nct*"}, curve: cpu}
"""


def pol(smooth: float = 20, text: str = POLICY):
    return load_policy_text(textwrap.dedent(text).replace("SMOOTH", str(smooth)), name="t")


def run(policy, series, devices=None, state=None):
    """(t, Tctl) per tick → the results; Tctl may be a Status (a failed reading)."""
    devices = devices or [nct(), k10temp(crit=95.0)]
    state = state or initial_state()
    out = []
    for t, temp in series:
        res = evaluate(policy, (), tick(devices, t, {TCTL: temp}), state)
        state = res.state
        out.append(res)
    return out


def duties(results):
    return [r.decisions[PWM].value for r in results]


def test_a_step_is_followed_linearly_and_fully_after_smoothing_s():
    series = [(float(t), 50.0 if t < 100 else 70.0) for t in range(0, 141)]
    d = duties(run(pol(20), series))
    assert d[99] == pytest.approx(30.0)                      # 50 °C → 30 %
    # a reading covers the second before it (right step): 70 °C at t=100 covers (99, 100]
    assert d[100] == pytest.approx(31.0)                     # 1 s of 70 °C in a 20 s mean: 51 °C
    assert d[109] == pytest.approx(40.0)                     # half way after 10 s
    assert d[118] == pytest.approx(49.0)
    assert d[119:] == [pytest.approx(50.0)] * 22             # 70 °C → 50 % once 20 s of it are in


def test_without_smoothing_the_step_is_followed_at_once():
    series = [(float(t), 50.0 if t < 100 else 70.0) for t in range(0, 110)]
    assert duties(run(pol(0), series))[100] == pytest.approx(50.0)
    assert pol(0).document.curves["cpu"].smoothing_s == 0
    assert load_policy_text("curves: {c: {kind: points, source: x, points: [[0, 0], [1, 1]]}}",
                            name="t").document.curves["c"].smoothing_s == 0


def test_noise_of_2_c_around_a_constant_is_flattened():
    rng = random.Random(7)
    series = [(float(t), 60.0 + rng.choice((-2.0, -1.0, 0.0, 1.0, 2.0))) for t in range(0, 400)]
    steady = duties(run(pol(30), series))[60:]
    raw = [temp - 20.0 for _, temp in series[60:]]
    assert max(raw) - min(raw) == pytest.approx(4.0)
    assert max(steady) - min(steady) < 1.2                   # ±2 °C in, well under ±0.6 % out
    assert sum(steady) / len(steady) == pytest.approx(40.0, abs=0.3)


def test_a_fresh_window_uses_the_history_it_has():
    d = duties(run(pol(30), [(0.0, 60.0), (1.0, 62.0), (2.0, 64.0)]))
    assert d == [pytest.approx(40.0), pytest.approx(42.0), pytest.approx(43.0)]  # right steps: (62+64)/2


@pytest.mark.parametrize("status", [Status.FAILED, Status.IMPLAUSIBLE, Status.STALE])
def test_a_failed_source_sends_the_fans_to_full_at_once_whatever_the_smoothed_history(status):
    series = [(float(t), 45.0) for t in range(0, 60)] + [(60.0, status), (61.0, status)]
    results = run(pol(30), series)
    assert results[59].decisions[PWM].value == pytest.approx(25.0)
    for res in results[60:]:
        d = res.decisions[PWM]
        assert (d.value, d.layer, d.rule) == (100.0, Layer.SAFETY, "safety/failed-source")


def test_a_recovered_source_is_smoothed_again():
    series = [(float(t), 45.0) for t in range(0, 60)] + [(60.0, Status.FAILED), (61.0, 45.0), (62.0, 45.0)]
    results = run(pol(30), series)
    assert results[61].decisions[PWM].layer == Layer.POLICY
    assert results[62].decisions[PWM].value == pytest.approx(25.0)


def test_a_critical_temperature_acts_on_the_raw_reading_at_once():
    # k10temp crit 95 °C − 5 °C margin: 90 °C is critical; the 60 s mean is still near 50 °C
    series = [(float(t), 50.0) for t in range(0, 120)] + [(120.0, 91.0)]
    results = run(pol(60), series)
    d = results[-1].decisions[PWM]
    assert (d.value, d.layer, d.rule) == (100.0, Layer.SAFETY, "safety/critical-temperature")
    policy_d = results[-1].layers["t"][PWM]
    assert policy_d.inputs["source:cpu"] == pytest.approx((59 * 50.0 + 91.0) / 60, abs=0.01)
    assert policy_d.inputs["raw:cpu"] == 91.0


def test_an_aggregated_source_is_smoothed_after_aggregation():
    text = POLICY.replace("source: Tctl", "source: {mean: [Tctl, SYSTIN]}")
    series = []
    for t in range(0, 40):
        series.append((float(t), {TCTL: 50.0 + (4.0 if t % 2 else -4.0), f"{NCT}/temp1": 50.0}))
    devices = [nct(), k10temp()]
    p = pol(10, text)
    state = initial_state()
    out = []
    for t, values in series:
        res = evaluate(p, (), tick(devices, t, values), state)
        state = res.state
        out.append(res.decisions[PWM].value)
    assert max(out[15:]) - min(out[15:]) < 0.5
    assert out[-1] == pytest.approx(30.0, abs=0.3)


def test_pid_curves_read_the_smoothed_source_too():
    text = """
    curves:
      cpu: {kind: pid, source: Tctl, setpoint_c: 50, kp: 1, ki: 0, base_pct: 30, smoothing_s: SMOOTH}
    rules:
      - {name: fans, kind: fan, fans: {chip: "nct*"}, curve: cpu}
    """
    series = [(float(t), 50.0 if t < 10 else 60.0) for t in range(0, 31)]
    d = duties(run(pol(10, text), series))
    assert d[9] == pytest.approx(30.0)
    assert d[15] == pytest.approx(36.0)
    assert d[20] == pytest.approx(40.0)


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "should be greater than or equal to 0"),
    ("601", "should be less than or equal to 600"),
    (".nan", "should be a finite number"),
    (".inf", "should be a finite number"),
    ("soon", "should be a valid number"),
])
def test_smoothing_s_out_of_bounds_is_an_error_at_its_line_and_column(value, message):
    text = textwrap.dedent(POLICY).replace("SMOOTH", value)
    with pytest.raises(PolicyErrors) as info:
        load_policy_text(text, name="p")
    col = text.splitlines()[2].index("smoothing_s: ") + len("smoothing_s: ") + 1
    assert f"p>:3:{col}: error: curves.cpu.smoothing_s: {message}" in str(info.value).splitlines()[0]


def test_mean_upto_warms_up_then_keeps_its_window():
    w = Window()
    assert w.mean_upto(10, 0.0) is None
    w = w.push(0.0, 10.0, 12.0)
    assert w.mean_upto(10, 0.0) == 10.0
    for t in range(1, 31):
        w = w.push(float(t), 20.0 if t > 20 else 10.0, 12.0)
        if t == 5:
            assert w.mean_upto(10, 5.0) == 10.0
    assert w.mean_upto(10, 30.0) == pytest.approx(20.0)
    # longer than the window keeps (horizon 12 s): the mean of what it holds, (18, 30]
    assert w.mean_upto(20, 30.0) == pytest.approx((2 * 10.0 + 10 * 20.0) / 12)
