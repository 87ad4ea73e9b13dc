"""The built-in safety layer: critical temperatures, failed sources, stricter-only policy settings."""

from __future__ import annotations

import textwrap

import pytest

from aithermd.model import Layer, Status
from aithermd.policy import safety
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from tests.policy.machines import K10, NCT, PKG, gpu, gpu_values, k10temp, nct, rapl, tick

NONE = load_policy_text("rules: []\n", name="none")


def pol(text: str, name: str = "t"):
    return load_policy_text(textwrap.dedent(text), name=name)


def test_gpu_at_slowdown_minus_margin_cuts_its_draw_and_sends_fans_to_full():
    devices = [gpu(0, fans=2), gpu(1)]
    res = evaluate(NONE, (), tick(devices, 0.0, {**gpu_values(0, 90, 400, temp=85.0),
                                                 **gpu_values(1, 90, 400, temp=84.9)}), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 360.0  # 10 % under its 400 W draw, not max → min
    assert res.decisions["gpu0/fan0"].value == 100.0 and res.decisions["gpu0/fan1"].value == 100.0
    assert all(d.layer == Layer.SAFETY for d in res.decisions.values())
    assert "gpu1/power_limit" not in res.decisions
    assert res.decisions["gpu0/power_limit"].inputs == {"gpu0/temperature": 85.0, "trigger_c": 85.0,
                                                        "latched_draw_w": 400.0}


def test_the_cut_deepens_with_each_degree_over_and_goes_to_min_at_the_threshold():
    devices = [gpu(0)]
    assert evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 400, temp=87.2)),
                    initial_state()).decisions["gpu0/power_limit"].value == 280.0  # 2 °C over: 30 % off
    assert evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 400, temp=90.0)),
                    initial_state()).decisions["gpu0/power_limit"].value == 150.0  # the slowdown itself
    assert evaluate(NONE, (), tick(devices, 0.0, {"gpu0/temperature": 85.0}),
                    initial_state()).decisions["gpu0/power_limit"].value == 150.0  # no draw to cut from


def test_a_glitched_draw_on_the_latching_tick_cuts_from_the_limit_in_force_for_the_whole_latch():
    """attack8 T1: one 2× power reading on the tick the die reached its trigger made the latch's reference
    675 W over a 337.5 W limit: the "cut" (607.5 W) was over the limit, nothing was written for the latch's
    life. A new latch cuts from the draw, never from above the limit in force (requested or enforced)."""
    devices = [gpu(0)]
    state = initial_state()
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 675.0, temp=85.0),
                                  knobs={"gpu0/power_limit": 337.5}), state)
    d = res.decisions["gpu0/power_limit"]
    assert d.value == 303.75 and d.inputs["latched_draw_w"] == 337.5  # 10 % under the limit in force
    # the next ticks read the true draw, 300 W, under the cut but not by 20 %: the cut binds, the reference
    # holds, and 2 °C over cuts 30 % of it
    for t in (1.0, 12.0):
        res = evaluate(NONE, (), tick(devices, t, gpu_values(0, 90, 300.0, temp=87.0),
                                      knobs={"gpu0/power_limit": d.value}), res.state)
    assert res.decisions["gpu0/power_limit"].value == pytest.approx(236.25)
    assert res.decisions["gpu0/power_limit"].inputs["latched_draw_w"] == 337.5


def test_a_cut_the_gpu_draws_far_under_for_10_s_cuts_again_from_what_it_draws():
    """attack8 T1, the rest: a reference from a 2× reading capped at the 337.5 W limit cut to 303.75 W, over
    the 230 W the job drew: nothing was cut. After a whole hold (10 s) drawing under 80 % of the cut, the
    highest draw of that time is the reference; a cut that then binds is not deepened again."""
    devices = [gpu(0)]
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 675.0, temp=85.0),
                                  knobs={"gpu0/power_limit": 337.5}), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 303.75
    draws = {t: 230.0 if t != 5 else 236.0 for t in range(1, 11)}  # the true draw, one second at 236 W
    limits = []
    for t, w in draws.items():
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, w, temp=85.5),
                                      knobs={"gpu0/power_limit": 303.75}), res.state)
        limits.append(res.decisions["gpu0/power_limit"].value)
    assert limits[:-1] == [303.75] * 9  # not before a whole hold
    assert limits[-1] == pytest.approx(0.9 * 236.0)  # 10 % under the highest draw of the hold
    assert res.decisions["gpu0/power_limit"].inputs["latched_draw_w"] == 236.0
    # now the cut binds: the draw sits at ~0.9 of it (the Zeus sweeps), and nothing deepens it for a minute
    cut = limits[-1]
    for t in range(11, 71):
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, 0.9 * cut, temp=85.5),
                                      knobs={"gpu0/power_limit": cut}), res.state)
        assert res.decisions["gpu0/power_limit"].value == pytest.approx(cut)
    # the enforced limit counts too, and a true draw under both is the reference as before
    from aithermd.model import KnobValue
    inp = tick(devices, 0.0, gpu_values(0, 90, 500.0, temp=85.0))
    inp = type(inp)(**{**inp.__dict__, "knobs": {"gpu0/power_limit": KnobValue(
        "gpu0/power_limit", 450.0, extra={"enforced_w": 400.0})}})
    assert evaluate(NONE, (), inp, initial_state()).decisions["gpu0/power_limit"].value == 360.0
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 250.0, temp=85.0),
                                  knobs={"gpu0/power_limit": 337.5}), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 225.0
    # no reading of the draw: the minimum at once, as before
    res = evaluate(NONE, (), tick(devices, 0.0, {"gpu0/temperature": 85.0, "gpu0/power": Status.FAILED},
                                  knobs={"gpu0/power_limit": 337.5}), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 150.0


def test_shutdown_threshold_is_used_when_there_is_no_slowdown():
    devices = [gpu(0, slowdown=None, shutdown=92.0)]
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 0, 30, temp=92.0)), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 150.0
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 0, 300, temp=87.0)), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 270.0


def test_the_latch_holds_its_cut_and_releases_after_30_s_three_degrees_under():
    devices = [gpu(0)]
    state = initial_state()
    seen = []
    live = [81.9, 81.8] * 16  # a live sensor's last digit: a release needs a reading that moved (attack5 C1)
    temps = [85.5] + [84] * 5 + live[:29] + [82.5] + live[:31] + [84]
    for t, temp in enumerate(temps):
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, 400, temp=temp)), state)
        state = res.state
        d = res.decisions.get("gpu0/power_limit")
        seen.append(None if d is None else (d.value, d.rule))
    cut = (360.0, "safety/critical-temperature")
    assert seen[0] == cut and set(seen[:66]) == {cut}  # held: 29 s cool, then a warmer reading
    # 30 s at 82 °C or under: released; 84 °C does not latch. The released cut stays as a ceiling
    # (policy/safety_ramp.py): nothing jumps back to the default at once.
    assert seen[66] == seen[67] == (360.0, "safety/release-ramp")
    assert "gpu0/temperature" not in state.latched


def test_a_reading_frozen_under_the_margin_does_not_release_the_latch():
    """attack5 C1: a reading that jumped under the release margin and froze there (a driver returning a
    cached value) released the cut after 30 s, and the die passed its trip point. A release needs the
    reading to move; a failed one keeps the cut as before."""
    devices, state, seen = [gpu(0)], initial_state(), []
    for t, temp in enumerate([85.5] + [40.0] * 600 + [40.0, 40.5] * 20):
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, 400, temp=temp)), state)
        state = res.state
        d = res.decisions.get("gpu0/power_limit")
        seen.append(None if d is None else d.rule)
    assert set(seen[:601]) == {"safety/critical-temperature"}  # ten minutes frozen: the cut holds
    assert seen[-1] == "safety/release-ramp"  # it moves: released after 30 s of a live reading


def test_a_temperature_hovering_at_its_trip_point_changes_the_limit_at_most_6_times_a_minute():
    """±2 °C of sensor noise around the trigger for ten minutes, with the die following the cut at once
    (0.05 K/W): the old layer swung maximum ↔ minimum many times a minute."""
    import random

    rng = random.Random(7)
    devices = [gpu(0)]
    state = initial_state()
    limit, changes, lowest = 450.0, [], 450.0
    for t in range(600):
        draw = min(400.0, limit)
        temp = 85.0 + 0.05 * (draw - 380.0) + rng.uniform(-2.0, 2.0)
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, draw, temp=round(temp))), state)
        state = res.state
        d = res.decisions.get("gpu0/power_limit")
        new = d.value if d is not None else 450.0
        if new != limit:
            changes.append(t)
            limit = new
            lowest = min(lowest, limit)
    per_minute = [sum(1 for c in changes if m * 60 <= c < (m + 1) * 60) for m in range(10)]
    assert changes and max(per_minute) <= 6, per_minute
    assert lowest > 150.0  # cut in proportion: never sent to the minimum by noise alone


def test_policy_margin_and_temperature_limit_only_make_safety_stricter():
    strict = pol("""
        safety: {margin_c: 15, gpu_temp_limit_c: 70}
        rules: []
        """)
    devices = [gpu(0)]
    res = evaluate(strict, (), tick(devices, 0.0, gpu_values(0, 0, 30, temp=72.0)), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 150.0
    assert safety.trigger_c(devices[0], {"slowdown": 90.0}, safety.SafetyParams(15.0, 70.0)) == 70.0
    assert safety.trigger_c(devices[0], {"slowdown": 80.0}, safety.SafetyParams(15.0, 70.0)) == 65.0


def test_a_hold_with_a_larger_margin_tightens_safety_for_everyone():
    strict = pol("safety: {margin_c: 20}\nrules: []\n", name="strict")
    devices = [gpu(0)]
    res = evaluate(NONE, (strict,), tick(devices, 0.0, gpu_values(0, 0, 30, temp=71.0)), initial_state())
    assert res.decisions["gpu0/power_limit"].layer == Layer.SAFETY


def test_hwmon_critical_sends_fans_reading_it_to_full_and_cpu_limits_to_min():
    p = pol("""
        curves:
          cpu: {kind: points, source: Tctl, points: [[40, 20], [80, 60]]}
        rules:
          - {name: fans, kind: fan, fans: "*/pwm2", curve: cpu}
          - {name: cpu, kind: cpu_power_limit, pl1_w: 125}
        """)
    devices = [nct(), k10temp(crit=95.0), rapl()]
    res = evaluate(p, (), tick(devices, 0.0, {f"{K10}/temp1": 91.0}), initial_state())
    assert res.decisions[f"{NCT}/pwm2"].value == 100.0
    assert res.decisions[f"{NCT}/pwm2"].rule == "safety/critical-temperature"
    assert res.decisions[f"{PKG}/pl1"].value == 10.0 and res.decisions[f"{PKG}/pl2"].value == 10.0
    # not fed by Tctl, not decided by the policy: a critical CPU still runs every board fan full (attack5 C11:
    # board fans on a fixed duty, or a curve of GPU temperatures only, did nothing while the package cooked)
    assert (res.decisions[f"{NCT}/pwm1"].value, res.decisions[f"{NCT}/pwm1"].rule) == (
        100.0, "safety/critical-temperature")


def test_failed_gpu_temperature_sends_its_fans_to_full():
    devices = [gpu(0, fans=1)]
    for status in (Status.FAILED, Status.IMPLAUSIBLE, Status.STALE):
        res = evaluate(NONE, (), tick(devices, 0.0, {"gpu0/temperature": status}), initial_state())
        d = res.decisions["gpu0/fan0"]
        assert (d.value, d.rule) == (100.0, "safety/failed-source")


def test_safety_overrides_a_policy_trying_to_stop_the_fan():
    p = pol("""
        rules:
          - {name: off, kind: fan, fans: "gpu0/fan0", duty_pct: 0}
        """)
    res = evaluate(p, (), tick([gpu(0)], 0.0, {"gpu0/temperature": Status.FAILED}), initial_state())
    assert res.decisions["gpu0/fan0"].value == 100.0
    assert res.layers["t"]["gpu0/fan0"].value == 0.0  # what the policy asked, before arbitration


def test_implausible_critical_reading_is_not_trusted_as_a_temperature():
    res = evaluate(NONE, (), tick([gpu(0, fans=0)], 0.0, {"gpu0/temperature": float("nan")}), initial_state())
    assert "gpu0/power_limit" not in res.decisions


def test_a_latch_with_its_power_limit_unreadable_cuts_to_the_minimum_never_above_the_limit():
    """attack9 N1: with the limit's readback failed the latch took the raw reading: a 2× sample "cut" a
    337.5 W limit to 415 W (a raise, over every policy). Nothing bounds the reading then: the minimum."""
    from aithermd.model import KnobValue
    devices = [gpu(0)]
    inp = tick(devices, 0.0, gpu_values(0, 90, 675.0, temp=85.0))
    failed = {"gpu0/power_limit": KnobValue("gpu0/power_limit", None, status=Status.FAILED)}
    inp = type(inp)(**{**inp.__dict__, "knobs": failed})
    assert evaluate(NONE, (), inp, initial_state()).decisions["gpu0/power_limit"].value == 150.0


def test_a_low_reading_on_the_latching_tick_cuts_from_half_the_limit_and_a_cut_that_binds_stays():
    """attack9 N3: a 0.1× sample on the latching tick cut a 200 W job to 21 W for minutes. The reference is at
    least half the limit in force; that cut binds the job's 200 W, so it holds."""
    devices = [gpu(0)]
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 20.0, temp=85.0),
                                  knobs={"gpu0/power_limit": 337.5}), initial_state())
    cut = res.decisions["gpu0/power_limit"].value
    assert cut == pytest.approx(0.9 * 168.75)
    for t in range(1, 31):  # the job holds at ~0.95 of the cut: it binds
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, 0.95 * cut, temp=85.5),
                                      knobs={"gpu0/power_limit": cut}), res.state)
        assert res.decisions["gpu0/power_limit"].value == pytest.approx(cut)


def test_one_reading_near_the_cut_does_not_hold_a_cut_that_limits_nothing():
    """attack9 N2: the re-reference compared the highest draw of the hold, so one reading at 80 % of the cut
    in the first 10 s froze a cut over the draw for the latch's life. The mean of the hold decides."""
    devices = [gpu(0)]
    res = evaluate(NONE, (), tick(devices, 0.0, gpu_values(0, 90, 675.0, temp=85.0),
                                  knobs={"gpu0/power_limit": 337.5}), initial_state())
    assert res.decisions["gpu0/power_limit"].value == 303.75
    for t in range(1, 11):
        w = 290.0 if t == 2 else 230.0  # one reading near the cut, the job's true draw 230 W
        res = evaluate(NONE, (), tick(devices, float(t), gpu_values(0, 90, w, temp=85.5),
                                      knobs={"gpu0/power_limit": 303.75}), res.state)
    assert res.decisions["gpu0/power_limit"].value == pytest.approx(0.9 * 290.0)  # cut again, from under it
