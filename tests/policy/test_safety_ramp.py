"""After a critical cut releases, the limit climbs back under a rising ceiling (policy/safety_ramp.py)
instead of jumping to the policy's value: a card that trips at its policy's value settled near the limit
that held it, where the old release swung it policy → cut → policy every minute (issue 18 §3, F6)."""

from __future__ import annotations

import math
import textwrap

from aithermd.model import Decision, Knob, KnobKind, Layer
from aithermd.policy import arbiter, safety_ramp
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from tests.policy.machines import gpu, gpu_values, tick

NONE = load_policy_text("rules: []\n", name="none")
KNOB = "gpu0/power_limit"
STEP_W = 30.0  # 5 % of the test card's 600 W maximum
CUT = "safety/critical-temperature"
RAMP = "safety/release-ramp"


def limit_policy(watts: float):
    return load_policy_text(textwrap.dedent(f"""
        rules:
          - {{name: cap, kind: gpu_power_limit, limit: {watts:g}}}
        """), name="p")


class Card:
    """A GPU drawing min(demand, limit) whose die sits 0.05 K/W over a heatsink with τ = 15 s (the calibrated
    fan-cooled card, aithermd/sim/gpu_sim.py), ``k_hs`` K/W over ``air_c``. Its trigger is 85 °C (slowdown
    90 °C − 5 °C); at 400 W it settles at 86 °C: over the trigger at its policy's value."""

    def __init__(self, demand_w: float = 400.0, k_hs: float = 0.09, air_c: float = 30.0) -> None:
        self.demand, self.k_hs, self.air = demand_w, k_hs, air_c
        self.hs = air_c + k_hs * 50.0  # idle before the job
        self.draw = 50.0

    def step(self, limit: float) -> float:
        self.draw = min(self.demand, limit)
        ss = self.air + self.k_hs * self.draw
        self.hs = ss + (self.hs - ss) * math.exp(-1.0 / 15.0)
        return self.hs + 0.05 * self.draw


class Run:
    """The engine deciding once a second on ``card`` (fake clock): ``seq`` [(t, limit in force, decision)].
    A knob nobody decides has its original (``default_w``) back."""

    def __init__(self, policy, card: Card | None = None, default_w: float = 450.0) -> None:
        self.policy, self.card, self.default = policy, card or Card(), default_w
        self.devices, self.state, self.limit, self.t = [gpu(0)], initial_state(), default_w, 0
        self.seq: list[tuple[int, float, Decision | None]] = []

    def tick(self, temp: float | None = None, devices=None):
        temp = self.card.step(self.limit) if temp is None else temp
        devs = self.devices if devices is None else devices
        values = gpu_values(0, 90, self.card.draw, temp=round(temp, 1) + live(self.t)) if devs else {}
        res = evaluate(self.policy, (), tick(devs, float(self.t), values), self.state)
        self.state, d = res.state, res.decisions.get(KNOB)
        self.limit = d.value if d is not None and d.value is not None else self.default
        self.seq.append((self.t, self.limit, d))
        self.t += 1
        return d

    def go(self, seconds: int) -> Run:
        for _ in range(seconds):
            self.tick()
        return self

    def ramps(self) -> list[str]:
        return [k for k in self.state.latched if k.startswith(safety_ramp.KEY)]


def live(t: int) -> float:
    """A live sensor's last digit (°C at second ``t``): a ramp steps only on a reading that moved since its
    last step, and the noise-free model settles to a constant."""
    return 0.05 * (t % 2)


def changes(seq) -> list[tuple[int, float, float]]:
    out, prev = [], seq[0][1]
    for t, limit, _d in seq[1:]:
        if limit != prev:
            out.append((t, prev, limit))
            prev = limit
    return out


def test_a_card_that_trips_at_its_policys_value_settles_under_it():
    seq = Run(limit_policy(450)).go(1200).seq
    moves = changes(seq)
    assert any(d is not None and d.rule == CUT for _t, _l, d in seq[:120]), "it never tripped"
    late = [m for m in moves if m[0] >= 600]
    per_minute = [sum(1 for m in late if 600 + 60 * i <= m[0] < 660 + 60 * i) for i in range(10)]
    # the old release: policy → cut → policy every minute or so, for ever; now settled: at most one change
    # in the last ten minutes, well inside the "at most 6 a minute" bound
    assert max(per_minute) <= 1 and len(late) <= 1, (moves, per_minute)
    ups = [(t, a, b) for t, a, b in moves if b > a]
    assert ups and all(b - a <= STEP_W + 1e-6 for _t, a, b in ups), ups  # a step at a time, never a jump
    assert 300.0 <= seq[-1][1] < 450.0  # near the limit that held it: above the cut, under the policy's
    assert all(limit <= 450.0 for _t, limit, _d in seq)


def test_the_limit_after_release_rises_a_step_per_30_s_of_calm_up_to_the_policys_value():
    r = Run(limit_policy(450)).go(60)  # trips while it heats up at 450 W
    assert any(d is not None and d.rule == CUT for _t, _l, d in r.seq)
    r.card.demand = 330.0  # the job got lighter: cool at any limit up to 450 W
    start = len(r.seq)
    r.go(900)
    after = r.seq[start:]
    assert any(d is not None and d.rule == RAMP for _t, _l, d in after), "no release ramp"
    ups = [(t, a, b) for t, a, b in changes(after) if b > a]
    assert len(ups) >= 3 and all(0 < b - a <= STEP_W + 1e-6 for _t, a, b in ups), ups
    assert all(u[0] - v[0] >= safety_ramp.STEP_HOLD_S - 1e-6 for v, u in zip(ups, ups[1:], strict=False)), ups
    assert r.seq[-1][1] == 450.0 and r.seq[-1][2].rule == "p/cap"  # the policy's value back, at its pace
    assert not r.ramps()  # at the knob's maximum the ramp ended


def test_the_ceiling_never_raises_the_policys_value():
    low = Run(limit_policy(300), Card(demand_w=600.0, k_hs=0.13))  # 300 W: 30 + 39 + 15 = 84 °C, no trip
    low.go(30)
    for temp in [88.0] + [70.0 + live(t) for t in range(200)]:  # a spike trips it; the cut releases
        low.tick(temp)
    rules = {d.rule for _t, _l, d in low.seq if d is not None}
    assert CUT in rules and low.ramps(), rules
    assert all(limit <= 300.0 for _t, limit, _d in low.seq[30:]), changes(low.seq)
    assert low.seq[-1][1] == 300.0 and low.seq[-1][2].rule == "p/cap"  # under the ceiling: the policy's
    # nobody decides the knob: the ceiling until it reaches the knob's default (450 W), then handed back
    free = Run(NONE)
    for temp in [86.0] + [70.0 + live(t) for t in range(600)]:
        free.tick(temp)
    values = [limit for _t, limit, d in free.seq if d is not None]
    assert values and max(values) < 450.0 and all(limit <= 450.0 for _t, limit, _d in free.seq)
    assert free.seq[-1][2] is None  # given back: the original returns, no write above it


def test_a_critical_temperature_during_the_ramp_cuts_at_once():
    r = Run(limit_policy(450))
    for temp in [86.0] + [70.0] * 100:
        r.tick(temp)
    d = r.seq[-1][2]
    assert d.rule == RAMP and d.value < 450.0 and "asked 450 W" in d.reason
    d = r.tick(90.0)  # the device's own slowdown threshold, in the middle of the ramp
    assert (d.rule, d.value, d.layer) == (CUT, 150.0, Layer.SAFETY)
    d = r.tick(86.0)  # over the trigger again: the cut holds, the ramp does not lift it
    assert (d.rule, d.value) == (CUT, 150.0)


def test_a_vanished_device_ends_its_ramp():
    r = Run(limit_policy(450))
    for temp in [86.0] + [70.0] * 40:
        r.tick(temp)
    assert r.seq[-1][2].rule == RAMP and r.ramps()
    r.tick(devices=[])  # unplugged (udev remove): no device, no knob
    assert not r.ramps()
    d = r.tick(70.0)  # back: a new card for all the daemon knows, its policy's value at once
    assert (d.rule, d.value) == ("p/cap", 450.0)


def test_a_ceiling_that_tripped_holds_a_step_under_it_for_10_minutes():
    knob = Knob(KNOB, "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 600.0, 450.0, True)
    r = safety_ramp.start(knob, "gpu0/temperature", 85.0, 360.0, None, 0.0)
    assert r is not None and r.ceiling == 360.0
    r = safety_ramp.step(r, 80.0, 85.0, 10.0)
    r = safety_ramp.step(r, 80.5, 85.0, 40.0)
    assert r.ceiling == 390.0
    r = safety_ramp.step(r, 83.0, 85.0, 80.0)  # within the release margin: no step, however long
    assert r.ceiling == 390.0 and r.cool_since is None
    r = safety_ramp.tripped(r, 90.0, 90.0)  # 390 W did not hold
    again = safety_ramp.start(knob, "gpu0/temperature", 85.0, 300.0, r, 150.0)  # released, cut to 300 W
    seen = [again.ceiling]
    for t in range(151, 800):
        again = safety_ramp.step(again, 80.0 + live(t), 85.0, float(t))
        seen.append(again.ceiling)
    assert seen[0] == 300.0 and max(seen[:539]) == 360.0  # up to the last ceiling that held, no further
    assert seen[-1] > 360.0  # ten minutes on it tries the next step again
    assert "not above 360 W until 10 min" in safety_ramp.decision(safety_ramp.start(
        knob, "gpu0/temperature", 85.0, 300.0, r, 150.0), knob, 151.0)[1].reason


def test_the_arbiter_takes_a_ceiling_as_a_min_not_a_value():
    knob = Knob(KNOB, "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 600.0, 450.0, True)
    knobs = {KNOB: knob}

    def dec(value: float, layer: Layer, rule: str) -> Decision:
        return Decision(KNOB, value, layer, rule, requested=value)

    ceiling = dec(360.0, Layer.SAFETY, arbiter.CEILING_RULE)
    under = dec(300.0, Layer.POLICY, "p/a")
    assert arbiter.merge([{KNOB: under}, {KNOB: ceiling}], knobs)[KNOB] is under  # the policy's, as it was
    got = arbiter.merge([{KNOB: dec(500.0, Layer.POLICY, "p/a")}, {KNOB: ceiling}], knobs)[KNOB]
    assert (got.value, got.rule, got.inputs["capped"]) == (360.0, arbiter.CEILING_RULE, "p/a")
    got = arbiter.merge([{KNOB: ceiling}, {KNOB: dec(550.0, Layer.OVERRIDE, "override")}], knobs)[KNOB]
    assert got.value == 360.0  # safety > override: the ceiling holds an operator override too
    cut = dec(200.0, Layer.SAFETY, CUT)
    assert arbiter.merge([{KNOB: ceiling}, {KNOB: cut}], knobs)[KNOB] is cut
    assert arbiter.merge([{KNOB: ceiling}], knobs)[KNOB].value == 360.0  # nobody else: the ceiling
    assert arbiter.merge([{KNOB: dec(460.0, Layer.SAFETY, arbiter.CEILING_RULE)}], knobs) == {}  # ≥ default


def test_a_frozen_reading_raises_nothing_and_an_unreadable_one_takes_the_ramp_back_to_its_cut():
    """attack5 C1: a GPU temperature frozen at 40 °C (under the release margin) stepped a released cut from
    208 W up to 598 W under a die past its trip point. A step needs a reading that moved since the last one,
    and a sensor found failed (no reading) puts the cut back."""
    knob = Knob(KNOB, "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 600.0, 450.0, True)
    r = safety_ramp.start(knob, "gpu0/temperature", 45.0, 207.7, None, 0.0)
    assert r is not None
    for t in range(1, 600):
        r = safety_ramp.step(r, 40.0, 45.0, float(t))
    assert r.ceiling == 207.7  # ten minutes at a bit-identical 40 °C: not a step
    for t in range(600, 700):
        r = safety_ramp.step(r, 40.0 + live(t), 45.0, float(t))
    assert 207.7 + STEP_W <= r.ceiling <= 207.7 + 4 * STEP_W  # alive: it climbs again, a step per 30 s
    r = safety_ramp.step(r, None, 45.0, 700.0)
    assert r.ceiling == 207.7 and safety_ramp.decision(r, knob, 700.0)[1].value == 207.7
