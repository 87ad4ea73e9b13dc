"""Fans in the policy engine: one rule for every GPU's fans through a "same GPU" source, calibrated start and
stop duties with a start/stop hysteresis, the admin's names in selectors, and the stall detector's actions in
the safety layer (kick, stalled, failed cooler)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aithermd.model import FanCalibration, Layer, Status
from aithermd.policy import curves as fc
from aithermd.policy import engine
from aithermd.policy.loader import load_policy_text
from aithermd.policy.rules import START_MARGIN_PCT, STOP_MARGIN_PCT, UNCALIBRATED_START_PCT, fan_limits
from aithermd.policy.schema import FanMatch, FanRule
from aithermd.policy.selectors import select_fans

from .machines import K10, NCT, PKG, gpu, k10temp, nct, rapl, tick, workstation

GPU_FANS = """
curves:
  gpu:
    kind: points
    source: {max: [{same_gpu: temperature}]}
    points: [[40, 30], [80, 100]]
rules:
  - {name: gpu-fans, kind: fan, fans: {id: "gpu*/fan*"}, curve: gpu}
"""


def decide(policy, devices, values, state=None, **kw):
    inp = tick(devices, kw.pop("t", 100.0), values, **kw)
    return engine.evaluate(policy, [], inp, state or engine.initial_state())


def test_one_rule_gives_each_gpus_fans_that_gpus_own_temperature():
    devices = (gpu(0, fans=2), gpu(1))
    policy = load_policy_text(GPU_FANS, name="p")
    res = decide(policy, devices, {"gpu0/temperature": 50.0, "gpu1/temperature": 70.0})
    d = res.decisions
    assert d["gpu0/fan0"].value == pytest.approx(47.5) and d["gpu0/fan1"].value == pytest.approx(47.5)
    assert d["gpu1/fan0"].value == pytest.approx(82.5)
    assert d["gpu1/fan0"].inputs["used:gpu"] == "gpu1/temperature"
    # gpu1's sensor fails: its fans go to full, gpu0's keep following gpu0
    res = decide(policy, devices, {"gpu0/temperature": 50.0, "gpu1/temperature": Status.FAILED})
    assert res.decisions["gpu1/fan0"].layer is Layer.SAFETY and res.decisions["gpu1/fan0"].value == 100.0
    assert res.decisions["gpu0/fan0"].rule == "p/gpu-fans"


def test_a_same_gpu_source_on_a_board_fan_finds_nothing_and_is_warned_about():
    from aithermd.policy.devicecheck import unsourced_fans

    text = GPU_FANS.replace('fans: {id: "gpu*/fan*"}', f'fans: {{id: "{NCT}/pwm1"}}')
    assert unsourced_fans(load_policy_text(text, name="p"), workstation()) == [
        ("gpu-fans", "gpu", (f"{NCT}/pwm1",))]


def test_the_gpu_fan_curve_on_a_machine_without_gpus_is_no_error_of_aithermd_check():
    """aithermd check --sysfs-root on a board without NVIDIA GPUs: the GPU fan rule drives nothing there, so
    its curve's source matching nothing is not an error; a rule that drives fans from it still is."""
    from aithermd.policy.devicecheck import check_devices

    board = (k10temp(), nct())
    assert check_devices(load_policy_text(GPU_FANS, name="p"), board) == []
    text = GPU_FANS.replace('fans: {id: "gpu*/fan*"}', 'fans: {chip: ["nct*"]}')
    errors = check_devices(load_policy_text(text, name="p"), board)
    assert [e.message for e in errors] == ["no temperature channel on this machine matches this source"]


CAL = FanCalibration(tachs=(f"{NCT}/fan1",), start_pct=30.0, stop_pct=20.0, calibrated=True)


def rule(**kw) -> FanRule:
    return FanRule(name="r", kind="fan", fans={"id": "x"}, duty_pct=50.0, **kw)


def test_min_and_start_duty_come_from_the_calibration_unless_the_policy_says_otherwise():
    knob = replace(nct().knobs[0], fan=CAL)
    assert fan_limits(rule(), knob) == (20.0 + STOP_MARGIN_PCT, 30.0 + START_MARGIN_PCT, None)
    assert fan_limits(rule(min_duty_pct=35, start_duty_pct=60), knob) == (35.0, 60.0, None)
    assert fan_limits(rule(min_duty_pct=0), knob) == (0.0, 30.0 + START_MARGIN_PCT, 20.0)  # may stop
    uncalibrated = nct().knobs[0]
    assert fan_limits(rule(), uncalibrated) == (0.0, UNCALIBRATED_START_PCT, None)
    detected_only = replace(uncalibrated, fan=FanCalibration(tachs=CAL.tachs))
    assert fan_limits(rule(), detected_only) == (0.0, UNCALIBRATED_START_PCT, None)


def test_a_fan_allowed_to_stop_stops_below_its_stop_duty_minus_the_hysteresis_and_starts_at_it():
    def shape(duty, last):
        return fc.shape(duty, 50.0, 10.0, fc.FanState(last, 9.0), start_duty_pct=35.0, stop_pct=20.0,
                        stop_hysteresis_pct=2.0)

    assert shape(19.0, 25.0) == 20.0  # running, just under its stop duty: held at the stop duty
    assert shape(18.1, 20.0) == 20.0
    assert shape(17.9, 20.0) == 0.0  # 2 % under: stops
    assert shape(19.0, 0.0) == 0.0  # still: does not start under its stop duty (no flapping)
    assert shape(20.0, 0.0) == 35.0  # starts with the kick
    assert shape(25.0, 20.0) == 25.0


def test_the_admins_name_selects_a_fan():
    devices = (replace(nct(), knobs=(replace(nct().knobs[0], label="CPU fan"), nct().knobs[1])),)
    assert [k.id for k in select_fans(FanMatch(label=["cpu*"]), devices)] == [f"{NCT}/pwm1"]
    by_channel = select_fans(FanMatch(label=["CHA_FAN1"]), devices)  # its fan channel's label
    assert [k.id for k in by_channel] == [f"{NCT}/pwm2"]


SHIPPED_LIKE = """
curves:
  board: {kind: points, source: Tctl, points: [[40, 30], [80, 100]]}
rules:
  - {name: board, kind: fan, fans: {chip: "nct*"}, curve: board}
"""


def test_a_stalled_fan_is_kicked_then_its_zone_is_a_failed_cooler():
    devices = (nct(), k10temp(), rapl(), gpu(0))
    policy = load_policy_text(SHIPPED_LIKE, name="p")
    values = {f"{K10}/temp1": 50.0, "gpu0/temperature": 50.0}
    kick = decide(policy, devices, values, fan_alarms={f"{NCT}/pwm1": "kick"}).decisions
    assert (kick[f"{NCT}/pwm1"].rule, kick[f"{NCT}/pwm1"].value) == ("safety/stalled-fan", 100.0)
    assert kick[f"{NCT}/pwm2"].rule == "p/board" and f"{PKG}/pl1" not in kick
    failed = decide(policy, devices, values, fan_alarms={f"{NCT}/pwm1": "failed"}).decisions
    assert (failed[f"{NCT}/pwm2"].rule, failed[f"{NCT}/pwm2"].value) == ("safety/failed-cooler", 100.0)
    assert (failed[f"{PKG}/pl1"].rule, failed[f"{PKG}/pl1"].value) == ("safety/failed-cooler", 10.0)
    assert f"{NCT}/pwm1 stalled: its zone ({K10}/temp1) is a failed cooler" == failed[f"{PKG}/pl2"].reason
    assert "gpu0/power_limit" not in failed or failed["gpu0/power_limit"].layer is not Layer.SAFETY
