"""No work for unchanged inputs, below the fan decisions of aithermd.policy.memo: a fan rule's sources are
resolved again only when a reading they read changes by value or status (rules._temps_kept), a smoothed
source every tick (its window moves with time), and the held-idle pass runs only on a machine with a GPU.
Each cache must never give back stale results: a moved reading, a failed one, a critical temperature, a
window that moves on the fake clock, a reload, a device that vanishes or appears."""

from __future__ import annotations

import pytest

from aithermd.model import (
    Channel,
    Device,
    DeviceKind,
    Knob,
    KnobKind,
    KnobValue,
    Layer,
    Quantity,
    Reading,
    Status,
)
from aithermd.policy import engine, rules
from aithermd.policy.loader import load_policy_text

from .machines import K10, NCT, k10temp, nct, tick

PWM1, PWM2 = f"{NCT}/pwm1", f"{NCT}/pwm2"
TCTL, SYSTIN, AUX = f"{K10}/temp1", f"{NCT}/temp1", f"{NCT}/temp2"
POLICY = """
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 30], [80, 100]]}
  case: {kind: points, source: SYSTIN, points: [[20, 20], [60, 100]], SMOOTH}
rules:
  - {name: cpu-fan, kind: fan, fans: {id: ["*/pwm1"]}, curve: cpu}
  - {name: case-fan, kind: fan, fans: {id: ["*/pwm2"]}, curve: case}
"""
DEVICES = (nct(), k10temp(crit=100.0))


class Run:
    """Ticks the engine once a second on the fake clock and counts the sources each rule resolves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, smooth: str = "smoothing_s: 0",
                 devices: tuple[Device, ...] = DEVICES) -> None:
        self.policy = load_policy_text(POLICY.replace("SMOOTH", smooth), name="p")
        self.devices = devices
        self.state = engine.initial_state()
        self.t = 0.0
        self.values: dict[str, float | Status] = {TCTL: 50.0, SYSTIN: 40.0, AUX: 30.0}
        self.resolved: list[str] = []
        real = rules._temps

        def spy(rule, inp, ctx):
            self.resolved.append(rule.name)
            return real(rule, inp, ctx)

        monkeypatch.setattr(rules, "_temps", spy)

    def step(self, **values: float | Status):
        self.values.update(values)
        self.t += 1.0
        self.resolved.clear()
        inp = tick(self.devices, self.t, dict(self.values), knobs={PWM1: 40.0, PWM2: 40.0})
        res = engine.evaluate(self.policy, [], inp, self.state)
        self.state = res.state
        return res


def test_a_rules_sources_are_resolved_again_only_when_a_reading_they_read_changes(monkeypatch):
    run = Run(monkeypatch)
    first = run.step()
    assert sorted(run.resolved) == ["case-fan", "cpu-fan"]
    assert first.decisions[PWM1].value == pytest.approx(47.5)
    run.step()
    assert run.resolved == []  # nothing moved
    run.step(**{AUX: 31.0})  # a channel neither rule reads
    assert run.resolved == []
    moved = run.step(**{TCTL: 60.0})
    assert run.resolved == ["cpu-fan"]  # only the rule that reads it
    assert moved.decisions[PWM1].value == pytest.approx(65.0)
    assert moved.decisions[PWM1].inputs["source:cpu"] == 60.0
    back = run.step(**{TCTL: 50.0})
    assert back.decisions[PWM1].value == pytest.approx(47.5) and run.resolved == ["cpu-fan"]


def test_a_reading_that_fails_with_the_same_value_is_not_taken_for_unchanged(monkeypatch):
    run = Run(monkeypatch)
    run.step()
    run.step()
    res = run.step(**{TCTL: Status.FAILED})
    assert run.resolved == ["cpu-fan"]
    assert res.decisions[PWM1].layer is Layer.SAFETY and res.decisions[PWM1].value == 100.0
    for _ in range(3):  # failed and unchanged: the fans stay at full every tick
        res = run.step()
        assert res.decisions[PWM1].rule == "safety/failed-source" and res.decisions[PWM1].value == 100.0
    assert run.resolved == []
    res = run.step(**{TCTL: 50.0})
    assert res.decisions[PWM1].rule == "p/cpu-fan" and res.decisions[PWM1].value == pytest.approx(47.5)


def test_a_critical_temperature_is_written_every_tick_while_the_rules_inputs_stand_still(monkeypatch):
    run = Run(monkeypatch)
    run.step()
    run.step(**{TCTL: 97.0})
    for _ in range(4):
        res = run.step()
        assert run.resolved == []  # the rule's own work is kept ...
        assert res.decisions[PWM1].rule == "safety/critical-temperature"  # ... the safety layer is not
        assert res.decisions[PWM1].value == 100.0


def test_a_smoothed_source_is_worked_out_every_tick_as_its_window_moves(monkeypatch):
    run = Run(monkeypatch, smooth="smoothing_s: 10")
    for _ in range(12):
        run.step()
    run.step(**{SYSTIN: 50.0})
    values = []
    for _ in range(5):  # the reading stands still; its 10 s mean climbs on the clock
        values.append(run.step().decisions[PWM2].value)
        assert "case-fan" in run.resolved
    assert values == sorted(values) and values[0] < values[-1]


def test_a_reload_resolves_again_with_the_same_readings(monkeypatch):
    """The new rule reads the very channels of the old one, so only the rule's identity tells them apart."""
    run = Run(monkeypatch)
    policy = POLICY.replace("SMOOTH", "smoothing_s: 0")
    run.policy = load_policy_text(policy.replace("source: Tctl", "source: {max: [Tctl, SYSTIN]}"), name="p")
    run.step()
    assert run.step().decisions[PWM1].inputs["source:cpu"] == 50.0 and run.resolved == []
    run.policy = load_policy_text(policy.replace("source: Tctl", "source: {min: [Tctl, SYSTIN]}"), name="p")
    res = run.step()
    assert "cpu-fan" in run.resolved
    assert res.decisions[PWM1].inputs["source:cpu"] == 40.0  # the min, not the max of the rule before
    assert res.decisions[PWM1].value == pytest.approx(30.0)


def test_a_device_that_vanishes_sends_its_fans_to_full_with_the_other_readings_unchanged(monkeypatch):
    run = Run(monkeypatch)
    run.step()
    run.step()
    run.devices = (nct(),)  # k10temp gone (its Tctl no longer read): a new plan, its rule compiled again
    del run.values[TCTL]
    res = run.step()
    assert "cpu-fan" in run.resolved
    assert res.decisions[PWM1].layer is Layer.SAFETY and res.decisions[PWM1].value == 100.0


HELD = """
rules:
  - name: lock-held
    kind: gpu_clocks
    when: {metric: gpu.held_idle_w, stat: last, above: 1}
    max_mhz: min
"""


def test_the_held_idle_pass_starts_when_a_gpu_appears():
    """Without a GPU the held-idle pass is skipped; a GPU plugged in later is watched from then on."""
    knobs = (Knob("gpu0/power_limit", "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 600.0, 450.0, True),
             Knob("gpu0/sm_clock_lock", "gpu0", KnobKind.SM_CLOCK_LOCK, "MHz", 210.0, 3105.0, 3105.0, True),
             Knob("gpu0/fan0", "gpu0", KnobKind.FAN, "%", 0.0, 100.0, None, True))  # a consumer card
    chans = (Channel("gpu0/utilization", "gpu0", "utilization", Quantity.UTILIZATION, "%"),
             Channel("gpu0/power", "gpu0", "power", Quantity.POWER, "W"))
    gpu = Device("gpu0", DeviceKind.GPU, "NVIDIA GeForce RTX 4090", chans, knobs)
    policy, state = load_policy_text(HELD, name="p"), engine.initial_state()
    found = []
    for t in range(1, 101):
        devices = (nct(),) if t <= 20 else (nct(), gpu)
        readings = {"gpu0/utilization": Reading("gpu0/utilization", 0.0),
                    "gpu0/power": Reading("gpu0/power", 60.0)} if t > 20 else {}
        inp = engine.EngineInput(t_mono=float(t), t_wall=1e9 + t, devices=devices, readings=readings,
                                 knobs={"gpu0/sm_clock_lock": KnobValue("gpu0/sm_clock_lock", 3105.0)},
                                 attrs={"gpu0": {"pstate": "P0"}} if t > 20 else {})
        result = engine.evaluate(policy, (), inp, state)
        state = result.state
        found.append("gpu0" in result.held_idle)
        if t <= 20:
            assert not result.held_idle and "gpu0/sm_clock_lock" not in result.decisions
    assert not found[79] and found[81]  # held from t = 21 s, found a minute later
    assert result.decisions["gpu0/sm_clock_lock"].value == 210.0


WINDOWED = """
machines:
  load:
    per: machine
    states:
      - name: calm
      - name: busy
        enter: {metric: temperature_c, sensor: SYSTIN, stat: mean, window_s: 20, above: 90}
curves:
  cpu: {kind: points, source: Tctl, points: [[40, 30], [80, 100]]}
rules:
  - {name: cpu-fan, kind: fan, fans: {id: ["*/pwm1"]}, curve: cpu}
"""
MEAN = "temperature_c[SYSTIN].mean_20s"


def test_a_statistic_that_moves_only_the_explanation_keeps_the_duty_and_explains_it_anew(monkeypatch):
    """A machine's window mean moves every tick on a channel the fan does not read (SYSTIN): the fan's duty
    and curve are kept (not worked out again), its decision shows this tick's statistic, not the last's."""
    run = Run(monkeypatch)
    run.policy = load_policy_text(WINDOWED, name="p")
    worked: list[str] = []
    real = rules._fan_value

    def spy(rule, *args):
        worked.append(rule.name)
        return real(rule, *args)

    monkeypatch.setattr(rules, "_fan_value", spy)
    for _ in range(25):  # the 20 s window full
        run.step()
    aux = 40.0
    for _ in range(4):
        worked.clear()
        aux += 2.0
        res = run.step(**{SYSTIN: aux})
        d = res.decisions[PWM1]
        assert worked == [] and run.resolved == []
        assert d.value == pytest.approx(47.5) and d.rule == "p/cpu-fan"
        stat = d.inputs[MEAN]
        assert stat > 40.0  # the mean of this tick's window, climbing
    means = []
    for _ in range(2):
        aux += 2.0
        d = run.step(**{SYSTIN: aux}).decisions[PWM1]
        means.append(d.inputs[MEAN])
    assert means[0] < means[1]
    moved = run.step(**{TCTL: 60.0}).decisions[PWM1]
    assert worked == ["cpu-fan"] and moved.value == pytest.approx(65.0)
