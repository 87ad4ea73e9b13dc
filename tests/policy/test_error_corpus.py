"""A corpus of broken policy files, each with its exact message (FILE:LINE:COL: error: KEY: message (hint))."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.errors import PolicyErrors
from aithermd.policy.loader import load_policies, load_policy_file

INVALID = Path(__file__).resolve().parents[1] / "fixtures" / "policies" / "invalid"

EXPECTED = {
    'above-and-below.yaml': ["{file}:4:11: error: rules[0].when: give exactly one of 'above' or 'below'"],
    'ambiguous-state.yaml': ["{file}:12:54: error: rules[0].when.state: state 'busy' is in several machines: write machine.state"],
    'bad-indentation.yaml': ["{file}:5:4: error: YAML: expected <block end>, but found '<block mapping start>' (while parsing a block collection at line 3, column 3) (hint: check the indentation of line 5 and the lines above it: the keys of one mapping start in the same column, a list's items start with '-' in the same column, with spaces; a value holding ': ' needs quotes)"],
    'bad-day.yaml': ["{file}:5:30: error: rules[0].when.schedule.days[1]: 'tues' is not one of: mon, tue, wed, thu, fri, sat, sun, workday, weekend, holiday (hint: did you mean 'tue'?)"],
    'bad-power-value.yaml': ["{file}:4:12: error: rules[0].limit: 'fast' is not a power value: expected watts (300 or '300 W'), a percentage of the default ('80%'), 'default', 'min', 'max' or 'efficient'"],
    'bad-rule-name.yaml': ["{file}:2:12: error: rules[0].name: 'my cap' is not a valid name (letters, digits, '-' and '_', starting with a letter or digit)"],
    'bad-time-of-day.yaml': ["{file}:5:24: error: rules[0].when.schedule.from: '25:00' is not a time of day HH:MM"],
    'condition-without-kind.yaml': ["{file}:4:11: error: rules[0].when: a condition needs one of the keys: metric, all, any, not, schedule, process, state (hint: did you mean 'metric'?)"],
    'cpu-rule-without-limits.yaml': ['{file}:2:5: error: rules[0]: give pl1_w, pl2_w or both'],
    'curve-points-not-increasing.yaml': ['{file}:2:8: error: curves.cpu: point temperatures must increase strictly'],
    'curve-without-points.yaml': ['{file}:3:5: error: curves.cpu: a points curve needs at least 2 points [[°C, %], ...]'],
    'duplicate-rule-name.yaml': ["{file}:3:12: error: rules[1].name: rule name 'cap' is already used by rules[0]"],
    'duplicate-yaml-key.yaml': ['{file}:5:5: error: YAML: duplicate key "limit" with value "min" (original value: "max") (while constructing a mapping at line 2, column 5)'],
    'empty.yaml': ["{file}:1:1: error: empty policy file: expected a mapping with 'rules'"],
    'fan-curve-and-duty.yaml': ["{file}:2:5: error: rules[0]: give exactly one of 'curve' or 'duty_pct'"],
    'first-state-with-exit.yaml': ['{file}:5:15: error: machines.load.states[0].exit: the first state has no state below it to exit to'],
    'mean-without-window.yaml': ["{file}:4:11: error: rules[0].when: stat 'mean' needs window_s > 0 (or use stat: last)"],
    'missing-limit.yaml': ['{file}:2:5: error: rules[0].limit: missing required key'],
    'key-indented-too-far.yaml': ["{file}:4:12: error: YAML: mapping values are not allowed here (hint: check the indentation of line 4 and the lines above it: the keys of one mapping start in the same column, a list's items start with '-' in the same column, with spaces; a value holding ': ' needs quotes)"],
    'misspelt-kind.yaml': ["{file}:3:11: error: rules[0].kind: unknown kind 'gpu_power_limt' (expected one of: gpu_power_limit, gpu_clocks, cpu_power_limit, cpu_knobs, fan) (hint: did you mean 'gpu_power_limit'?)"],
    'misspelt-limit.yaml': ["{file}:4:5: error: rules[0].limt: unknown key (hint: did you mean 'limit'?)"],
    'mix-cycle.yaml': ["{file}:2:26: error: curves.a.curves: curve 'a' is part of a cycle: a → b → a"],
    'mix-refers-to-itself.yaml': ["{file}:4:13: error: curves.loop.curves: curve 'loop' refers to itself: loop → loop"],
    'negative-window.yaml': ['{file}:4:63: error: rules[0].when.window_s: should be greater than or equal to 0'],
    'percent-out-of-range.yaml': ['{file}:2:47: error: rules[0].limit: 500% of the default is out of range (1–200 %)'],
    'safety-loosened.yaml': ['{file}:2:13: error: safety.margin_c: safety can only be made stricter: margin_c must be ≥ 5 (the built-in margin)'],
    'smoothing-too-long.yaml': ['{file}:6:18: error: curves.board.smoothing_s: should be less than or equal to 600'],
    'state-without-enter.yaml': ["{file}:5:9: error: machines.load.states[1]: state 'busy' needs 'enter' (the condition that leads to it)"],
    'stop-below-without-curve.yaml': ["{file}:2:5: error: rules[0]: stop_below_c reads the temperature of the rule's curve: it needs 'curve', not 'duty_pct'"],
    'temperature-without-sensor.yaml': ["{file}:4:11: error: rules[0].when: metric temperature_c needs 'sensor' (a channel id or label)"],
    'top-level-list.yaml': ['{file}:1:1: error: a policy file is a mapping (description, safety, curves, machines, rules)'],
    'unknown-curve.yaml': ["{file}:7:12: error: rules[0].curve: no curve named 'boadr' (hint: did you mean 'board'?)"],
    'unknown-key-sustain.yaml': ["{file}:6:83: error: machines.load.states[1].enter.sustain: unknown key (hint: did you mean 'sustain_s'?)"],
    'unknown-metric.yaml': ["{file}:4:20: error: rules[0].when.metric: 'gpu.utilisation_pct' is not one of: gpu.utilization_pct, gpu.memory_utilization_pct, gpu.power_w, gpu.power_pct, gpu.temperature_c, gpu.memory_temperature_c, gpu.held_idle_w, cpu.utilization_pct, cpu.power_w, temperature_c (hint: did you mean 'gpu.utilization_pct'?)"],
    'unknown-state.yaml': ["{file}:10:19: error: rules[0].when.state: no state 'load.bsy' (hint: did you mean 'load.busy'?)"],
    'unknown-top-level-key.yaml': ["{file}:2:1: error: rule: unknown key (hint: did you mean 'rules'?)"],
    'yaml-syntax.yaml': ["{file}:3:1: error: YAML: expected ',' or '}', but got '<stream end>' (while parsing a flow mapping at line 2, column 5)"],
}


def test_every_corpus_file_has_an_expectation():
    assert sorted(p.name for p in INVALID.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_policy_gives_its_exact_message(name):
    path = INVALID / name
    with pytest.raises(PolicyErrors) as info:
        load_policy_file(path)
    assert [e.format().replace(str(path), "{file}") for e in info.value.errors] == EXPECTED[name]
    assert all(e.path == str(path) for e in info.value.errors)


def test_a_directory_with_one_broken_file_loads_nothing(tmp_path):
    good = (Path(__file__).resolve().parents[2] / "policies" / "balanced.yaml").read_text()
    (tmp_path / "good.yaml").write_text(good)
    (tmp_path / "bad.yaml").write_text((INVALID / "misspelt-kind.yaml").read_text())
    with pytest.raises(PolicyErrors) as info:
        load_policies([tmp_path])
    assert [e.path for e in info.value.errors] == [str(tmp_path / "bad.yaml")]
