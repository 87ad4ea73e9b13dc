"""Held-high idle: found after a minute, latched until work returns, its clocks locked by a policy."""

from __future__ import annotations

import pytest

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, KnobValue, Quantity, Reading
from aithermd.policy import held
from aithermd.policy.engine import EngineInput, evaluate, initial_state
from aithermd.policy.loader import load_policy_text


def gpu(default_w=450.0, fans=1):
    knobs = [Knob("gpu0/power_limit", "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 600.0, default_w, True),
             Knob("gpu0/sm_clock_lock", "gpu0", KnobKind.SM_CLOCK_LOCK, "MHz", 210.0, 3105.0, 3105.0, True)]
    knobs += [Knob(f"gpu0/fan{i}", "gpu0", KnobKind.FAN, "%", 0.0, 100.0, None, True) for i in range(fans)]
    chans = (Channel("gpu0/utilization", "gpu0", "utilization", Quantity.UTILIZATION, "%"),
             Channel("gpu0/power", "gpu0", "power", Quantity.POWER, "W"))
    return Device("gpu0", DeviceKind.GPU, "NVIDIA GeForce RTX 4090", chans, tuple(knobs))


def run(dev, series, state=None):
    """``series``: (seconds, utilization %, power W, pstate). Returns the memory and the held GPUs after
    each second."""
    state = state or {}
    out = []
    t = 0.0
    for seconds, util, power, pstate in series:
        for _ in range(seconds):
            t += 1.0
            readings = {"gpu0/utilization": Reading("gpu0/utilization", util),
                        "gpu0/power": Reading("gpu0/power", power)}
            state, found = held.update(state, (dev,), readings, {"gpu0": {"pstate": pstate}}, t)
            out.append(found.get("gpu0"))
    return state, out


def test_a_card_at_its_floor_is_never_held_and_teaches_its_floor():
    state, out = run(gpu(), [(300, 0.0, 20.0, "P8")])
    assert not any(out)
    assert state["gpu0"].floor_w == pytest.approx(20.0)


def test_a_card_held_at_p0_is_found_after_a_minute_and_blips_do_not_reset_it():
    state, out = run(gpu(), [(120, 0.0, 20.0, "P8"), (30, 2.0, 55.0, "P0"), (40, 0.0, 55.0, "P0")])
    assert out[149] is None and out[179] is None  # held from t = 121 s: 59 s at t = 180 s
    h = out[180]
    assert h is not None and h.excess_w == pytest.approx(35.0) and h.learned and h.pstate == "P0"
    _, after_work = run(gpu(), [(10, 60.0, 200.0, "P0")], state)
    assert not any(after_work)


def test_held_stays_held_while_a_clock_lock_lowers_its_draw_and_shows_what_it_saved():
    state, out = run(gpu(), [(120, 0.0, 20.0, "P8"), (70, 0.0, 60.0, "P0")])
    assert out[-1] is not None
    state, out = run(gpu(), [(30, 0.0, 32.0, "P0")], state)  # locked to the lowest clock: 28 W less
    assert all(out) and out[-1].recovered_w == pytest.approx(28.0) and out[-1].held_w == pytest.approx(60.0)
    _, out = run(gpu(), [(5, 0.0, 20.0, "P8")], state)  # the process let go: low P-state
    assert not any(out)


def test_before_a_floor_is_learned_a_share_of_the_default_judges():
    # held since the daemon started: 6 % of a consumer card's default limit, 10 % of a datacenter one's
    _, out = run(gpu(450.0), [(70, 0.0, 45.0, "P2")])
    assert out[-1] is not None and not out[-1].learned and out[-1].floor_w == pytest.approx(27.0)
    _, out = run(gpu(700.0, fans=0), [(70, 0.0, 72.0, "P0")])  # an H100 idling at its usual P0
    assert not any(out)
    _, out = run(gpu(700.0, fans=0), [(70, 0.0, 130.0, "P0")])
    assert out[-1] is not None and out[-1].floor_w == pytest.approx(70.0)


POLICY = """
rules:
  - name: lock-held
    kind: gpu_clocks
    when: {metric: gpu.held_idle_w, stat: last, above: 1}
    max_mhz: min
"""


def test_a_policy_locks_a_held_card_to_its_lowest_clock_until_work_returns():
    dev, policy = gpu(), load_policy_text(POLICY, name="p")
    state = initial_state()
    values = []
    for t in range(1, 181):
        busy = t > 150
        readings = {"gpu0/utilization": Reading("gpu0/utilization", 80.0 if busy else 0.0),
                    "gpu0/power": Reading("gpu0/power", 300.0 if busy else 60.0)}
        inp = EngineInput(t_mono=float(t), t_wall=1e9 + t, devices=(dev,), readings=readings,
                          knobs={"gpu0/sm_clock_lock": KnobValue("gpu0/sm_clock_lock", 3105.0)},
                          attrs={"gpu0": {"pstate": "P0"}})
        result = evaluate(policy, (), inp, state)
        state = result.state
        dec = result.decisions.get("gpu0/sm_clock_lock")
        values.append(None if dec is None else dec.value)
        if t == 100:
            assert result.held_idle["gpu0"].excess_w == pytest.approx(33.0)  # over 6 % of 450 W
            assert dec.rule == "p/lock-held" and "lowest clock" in dec.reason
    assert values[58] is None and values[60] == 210.0  # found after a minute (the fallback floor judges)
    assert values[149] == 210.0 and values[151] is None  # work returned: handed back (unlocked)
