"""Curve sources with optional inputs and alternatives in order: which failures send fans to full, which
channel is used, and the smoothing window that follows the same resolution."""

from __future__ import annotations

import textwrap

import pytest

from aithermd.model import Layer, Status
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.sources import Input, key, parse_key
from tests.policy.machines import NCT, gpu, k10temp, nct, tick

K10 = "hwmon:k10temp-pci-00c3"
POLICY = """
curves:
  board:
    kind: points
    source:
      max:
        - first: [[Tctl, Tdie], "gpu*/temperature"]
        - {sensor: "SYSTIN", optional: true}
    points: [[40, 20], [80, 100]]
rules:
  - {name: fans, kind: fan, fans: {chip: "nct*"}, curve: board}
"""


def run(values_per_tick, devices, text=POLICY):
    policy = load_policy_text(textwrap.dedent(text), name="t")
    state, out = initial_state(), []
    for t, values in enumerate(values_per_tick):
        res = evaluate(policy, (), tick(devices, float(t), values), state)
        state = res.state
        out.append(res.decisions[f"{NCT}/pwm1"])
    return out


@pytest.fixture
def devices():
    return (nct(), k10temp(), gpu(0))


def test_the_first_alternative_the_machine_has_is_used(devices):
    systin = f"{NCT}/temp1"
    (d,) = run([{f"{K10}/temp1": 60.0, "gpu0/temperature": 70.0, systin: 30.0}], devices)
    assert d.layer is Layer.POLICY and d.value == pytest.approx(60.0)
    assert d.inputs["used:board"] == f"{K10}/temp1,{systin}"
    (d,) = run([{"gpu0/temperature": 70.0, systin: 30.0}], (nct(), gpu(0)))  # no k10temp on this one
    assert d.layer is Layer.POLICY and d.value == pytest.approx(80.0)
    assert d.inputs["used:board"] == f"gpu0/temperature,{systin}"


def test_an_alternative_never_stands_in_for_a_chosen_sensor_that_fails(devices):
    (d,) = run([{f"{K10}/temp1": Status.FAILED, "gpu0/temperature": 70.0, f"{NCT}/temp1": 30.0}], devices)
    assert (d.layer, d.rule, d.value) == (Layer.SAFETY, "safety/failed-source", 100.0)
    assert d.reason == f"source {K10}/temp1 is failed: fan to full"


def test_a_failed_optional_input_is_left_out(devices):
    (d,) = run([{f"{K10}/temp1": 60.0, "gpu0/temperature": 70.0, f"{NCT}/temp1": Status.FAILED}], devices)
    assert d.layer is Layer.POLICY and d.value == pytest.approx(60.0)


def test_a_required_input_still_sends_the_fans_to_full(devices):
    text = POLICY.replace('{sensor: "SYSTIN", optional: true}', '"SYSTIN"')
    (d,) = run([{f"{K10}/temp1": 60.0, f"{NCT}/temp1": Status.FAILED}], devices, text)
    assert (d.layer, d.value) == (Layer.SAFETY, 100.0)


def test_no_alternative_on_this_machine_is_no_source(devices):
    (d,) = run([{}], (nct(),), POLICY.replace('{sensor: "SYSTIN", optional: true}', '"nothing-here"'))
    assert (d.layer, d.value) == (Layer.SAFETY, 100.0)
    assert "(no source)" in d.reason


def test_smoothing_follows_the_resolved_source(devices):
    """An optional input that fails leaves the smoothed source going (the window takes what reads)."""
    text = POLICY.replace("    points:", "    smoothing_s: 10\n    points:")
    seen = run([{f"{K10}/temp1": 40.0, f"{NCT}/temp1": 30.0},
                {f"{K10}/temp1": 70.0, f"{NCT}/temp1": Status.FAILED},
                {f"{K10}/temp1": 40.0, f"{NCT}/temp1": 30.0}], devices, text)
    assert [d.layer for d in seen] == [Layer.POLICY] * 3
    assert seen[1].inputs["raw:board"] == 70.0  # smoothed: the window took this tick's value
    assert 40.0 < seen[2].inputs["source:board"] < 70.0


def test_window_keys_round_trip():
    inputs = (Input("a"), Input("b", optional=True))
    assert key("max", inputs) == "source:max|a;?b"
    assert parse_key(key("max", inputs)) == ("max", inputs)
