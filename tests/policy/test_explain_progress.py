"""How far a policy's time is along, as the engine computes it: each decision's Explain inputs carry
``{"elapsed_s", "need_s"}`` for the windows every sample must meet, the state's minimum dwell, windows whose
history is still short, and the ``sustain_s`` timers of rules that do not hold yet (aithermctl draws them;
it computes none of it)."""

from __future__ import annotations

import textwrap

from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.windows import Window
from tests.policy.machines import gpu, gpu_values, tick

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
EXIT = "gpu.utilization_pct.max_10s < 10"


def inputs_over(policy_text: str, util: list[float]) -> list[dict]:
    """gpu0/power_limit's decision inputs at each second of ``util`` (None where nothing decided it)."""
    policy = load_policy_text(textwrap.dedent(policy_text), name="t")
    state, out = initial_state(), []
    for t, u in enumerate(util):
        res = evaluate(policy, (), tick([gpu(0)], float(t), gpu_values(0, u, 300 if u else 30)), state, {})
        state = res.state
        d = res.decisions.get("gpu0/power_limit")
        out.append(dict(d.inputs) if d is not None else None)
    return out


def test_the_exit_window_counts_the_time_since_the_last_busy_sample():
    inputs = inputs_over(MACHINE.replace("DWELL", "0"), [90.0] * 6 + [0.0] * 12)
    # busy from t=5; the last busy sample is at t=5, so at t=8 the idle window has held 3 s of its 10 s
    assert EXIT not in inputs[5]  # it entered busy this tick
    assert inputs[6][EXIT] == {"elapsed_s": 1.0, "need_s": 10.0}
    assert inputs[8][EXIT] == {"elapsed_s": 3.0, "need_s": 10.0}
    assert inputs[14][EXIT] == {"elapsed_s": 9.0, "need_s": 10.0}
    assert inputs[15]["state:load"] == "idle" and inputs[15][EXIT] == {"elapsed_s": 10.0, "need_s": 10.0}
    assert not any(isinstance(v, dict) for v in inputs[16].values())  # idle: nothing is filling any more


def test_a_dwell_shows_while_it_keeps_the_state():
    inputs = inputs_over(MACHINE.replace("DWELL", "30"), [90.0] * 6 + [0.0] * 4)
    assert inputs[5]["dwell:load"] == {"elapsed_s": 0.0, "need_s": 30.0}
    assert inputs[9]["dwell:load"] == {"elapsed_s": 4.0, "need_s": 30.0}
    assert EXIT not in inputs[9]  # the exit is not even looked at before the dwell ends


def test_a_rule_whose_sustain_timer_is_filling_shows_it_with_the_rule_that_decides():
    policy = """
        rules:
          - name: boost
            kind: gpu_power_limit
            when: {metric: gpu.utilization_pct, stat: last, above: 50, sustain_s: 3}
            limit: max
          - {name: base, kind: gpu_power_limit, limit: default}
        """
    inputs = inputs_over(policy, [0.0, 90.0, 90.0, 90.0, 90.0, 0.0])
    key = "boost: gpu.utilization_pct.last sustained"
    assert key not in inputs[0]  # the condition does not hold: no timer runs
    assert inputs[2][key] == {"elapsed_s": 1.0, "need_s": 3.0}  # decided by base, boost 1 s of 3 s along
    assert inputs[4]["gpu.utilization_pct.last sustained"] == {"elapsed_s": 3.0, "need_s": 3.0}  # boost's own
    assert key not in inputs[5]


def test_window_held_s_walks_back_to_the_last_sample_that_failed():
    w = Window()
    for t, v in [(0, 5.0), (1, 50.0), (2, 5.0), (3, 5.0), (4, 5.0)]:
        w = w.push(float(t), v, 10.0)
    def below(x: float) -> bool:
        return x < 10

    assert w.held_s(below, 10.0, 4.0) == 3.0  # since the 50 at t=1
    assert w.held_s(below, 2.0, 4.0) == 2.0  # at most the window
    assert w.held_s(lambda x: True, 10.0, 4.0) == 4.0  # a history of 4 s, shorter than the window
    assert Window().held_s(below, 10.0, 4.0) == 0.0
