"""The efficient-limit search: its rule, its steps, its reverts, and the search on the calibrated
simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aithermd.errors import PolicyErrors
from aithermd.model import Reading, Status
from aithermd.policy import efficient
from aithermd.policy.efficient import BASELINE, REVERTED, SETTLED, SNAP, STEP, Spec
from aithermd.policy.loader import load_policy_text
from aithermd.sim import loop
from aithermd.sim.jobs import TRAINING, Job
from aithermd.sim.law import JobLaw
from aithermd.sim.profiles import shipped_profiles

RULE = """
machines:
  load:
    states:
      - name: idle
        enter: {metric: gpu.utilization_pct, stat: max, window_s: 30, below: 10}
      - name: busy
        enter: {metric: gpu.utilization_pct, stat: mean, window_s: 20, above: 50}
rules:
  - name: search
    kind: gpu_power_limit
    when: {state: load.busy}
    limit: efficient
%s
"""


def policy(extra: str = "    max_slowdown_pct: 3\n    measure_s: 60"):
    return load_policy_text(RULE % extra, name="search")


def test_the_rule_and_its_keys():
    rule = policy().document.rules[0]
    assert rule.limit == "efficient" and rule.max_slowdown_pct == 3 and rule.measure_s == 60
    bad = RULE.replace("limit: efficient", "limit: default") % "    max_slowdown_pct: 3"
    with pytest.raises(PolicyErrors, match="only go with limit: efficient"):
        load_policy_text(bad, name="bad")
    with pytest.raises(PolicyErrors):
        policy("    max_slowdown_pct: 50")
    with pytest.raises(PolicyErrors):
        policy("    signal: telepathy")


def readings(power=300.0, util=95.0, clock=2500.0, progress=None, tensor=None):
    out = {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
           "gpu0/sm_clock": Reading("gpu0/sm_clock", clock)}
    if progress is not None:
        out["gpu0/progress_rate"] = Reading("gpu0/progress_rate", progress)
    if tensor is not None:
        out["gpu0/tensor_activity"] = Reading("gpu0/tensor_activity", tensor)
    return out


def test_the_best_readable_signal_is_chosen():
    spec = Spec()
    assert efficient.pick_signal(spec, "gpu0", readings(progress=3.0, tensor=40.0)) == "progress"
    assert efficient.pick_signal(spec, "gpu0", readings(tensor=40.0)) == "gpm"
    assert efficient.pick_signal(spec, "gpu0", readings()) == "proxy"
    assert efficient.pick_signal(Spec(signal="progress"), "gpu0", readings()) is None
    failed = readings()
    failed["gpu0/sm_clock"] = Reading("gpu0/sm_clock", None, Status.FAILED, "NVML_ERROR_UNKNOWN")
    assert efficient.pick_signal(spec, "gpu0", failed) is None


class Job1:
    """A job whose throughput and draw follow a simple law: unbound it draws 300 W and runs at 1.0; under a
    cap its draw is at most 0.95 × the cap and its speed falls 0.3 % per 1 % of power."""

    def at(self, limit):
        power = min(300.0, 0.95 * limit)
        return power, (power / 300.0) ** 0.3


def drive(spec, job, seconds, *, t0=0.0, default=450.0, attrs=None, knob_at=None, state=None):
    s = state or efficient.start(spec, "gpu0", t0, default, readings())
    t = t0
    limits = []
    for _ in range(seconds):
        t += 1.0
        power, rate = job.at(s.limit)
        r = readings(power=power, clock=2500.0 * rate)
        s = efficient.step(spec, s, "gpu0", t, r, attrs or {}, 150.0,
                           s.limit if knob_at is None else knob_at)
        limits.append(s.limit)
    return s, limits


def test_a_search_snaps_steps_down_backs_off_once_and_settles():
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s, limits = drive(spec, Job1(), 600)
    assert s.phase == SETTLED and s.backoffs == 1
    changes = [b for a, b in zip(limits, limits[1:], strict=False) if a != b]
    down = changes[:-1]
    assert down == sorted(down, reverse=True)  # monotone until its one back-off
    assert changes[-1] > changes[-2]
    # it stops where the job would lose more than 3 %: (0.95 L / 300) ** 0.3 ≥ 0.97 → L ≥ 285 W
    assert 285.0 <= s.limit <= 300.0
    assert s.peak == 300 and s.own == pytest.approx(300.0)
    text, inputs = efficient.explain(s, spec)
    assert "settled" in text and inputs["signal"] == "proxy" and "baseline" in inputs["steps"]
    assert inputs["steps"].count("miss") == 1


def test_before_its_first_verdict_the_search_says_it_has_no_steps_yet():
    """explain showed "steps ." while the search measured its baseline."""
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s = efficient.start(spec, "gpu0", 0.0, 450.0, readings())
    text, inputs = efficient.explain(s, spec)
    assert s.phase == BASELINE and inputs["steps"] == "none yet"
    assert text == "efficient limit (baseline, signal proxy): measuring the job at the default"


def test_thermal_slowdown_and_an_unreadable_signal_revert_to_the_default():
    spec = Spec(measure_s=30.0)
    s, _ = drive(spec, Job1(), 200)
    assert s.limit < 450.0
    reasons = {"clock_event_reasons": ("hw_thermal_slowdown",)}
    hot = efficient.step(spec, s, "gpu0", 201.0, readings(), reasons, 150.0, s.limit)
    assert hot.phase == REVERTED and hot.limit == 450.0 and "thermal" in hot.why
    lost = readings()
    del lost["gpu0/sm_clock"]
    blind = efficient.step(spec, s, "gpu0", 201.0, lost, {}, 150.0, s.limit)
    assert blind.phase == REVERTED and blind.limit == 450.0
    # after a window back at the default it measures the job again
    again, _ = drive(spec, Job1(), 40, t0=201.0, state=hot)
    assert again.phase in (BASELINE, SNAP)


def test_nothing_is_measured_while_the_card_is_held_elsewhere():
    spec = Spec(measure_s=30.0)
    s, _ = drive(spec, Job1(), 300, knob_at=200.0)  # an override holds the card at 200 W
    assert s.phase == BASELINE and s.acc.samples == ()


def test_a_lighter_phase_starts_a_new_search():
    spec = Spec(measure_s=30.0)
    s, _ = drive(spec, Job1(), 600)
    assert s.phase == SETTLED

    class Lighter:
        def at(self, limit):
            return 150.0, 1.0

    s2, _ = drive(spec, Lighter(), 80, t0=600.0, state=s)
    assert s2.phase in (BASELINE, SNAP, STEP) and "lighter" in s2.why


def test_a_limit_settled_above_the_own_draw_is_no_lighter_phase():
    """Settled halfway back up, above the job's own draw, the job draws its own draw, not 0.9 of the
    limit: that is not a new phase (the daemon's simulation restarted such searches every few minutes)."""
    spec = Spec(measure_s=30.0)
    s, _ = drive(spec, Job1(), 600)
    high = replace(s, limit=400.0, best=400.0, own=260.0, acc=efficient.Acc(600.0))

    class OwnDraw:
        def at(self, limit):
            return 240.0, 1.0

    s2, _ = drive(spec, OwnDraw(), 80, t0=600.0, state=high, knob_at=400.0)
    assert s2.phase == SETTLED and s2.limit == 400.0 and "lighter" not in s2.why


def test_the_search_on_the_calibrated_simulator_keeps_its_budget_with_the_exact_signal():
    """A job from the Zeus table on an RTX 4090: the search with the job's progress rate saves energy
    per unit of work and stays near its budget; its steps go down with at most one back-off."""
    from aithermd.sim.workload import CycleWorkload

    pol = policy("    max_slowdown_pct: 3\n    measure_s: 120")
    w = CycleWorkload(idle_before_s=60, training_s=3600, idle_after_s=0, seed=1003)
    res = loop.run(shipped_profiles()["rtx4090"], w, 3660, policy=pol, progress=True)
    assert res.gain_pct() > 2.0 and res.slowdown_pct() < 4.0
    searched = [c for c in res.changes if "efficient" in c[4]]
    lows = [c[2] for c in searched]
    assert sum(1 for a, b in zip(lows, lows[1:], strict=False) if b > a) <= 1 + sum(
        "search again" in c[4] for c in searched)
    assert res.last_inputs["search"] == SETTLED and res.last_inputs["signal"] == "progress"


def test_a_small_job_is_capped_near_its_own_draw_within_the_budget():
    """A job drawing a third of the default limit, steadily: the default never binds it; the search caps
    it near its own draw (144 W of 450), and it loses about the budget — within half a standard error of
    its windows, which the search allows before it calls a step a miss."""
    job = Job(TRAINING, 0.33, JobLaw(1.0, 0.78), mem_frac=0.4)
    from aithermd.sim.workload import GpuLoad

    class One:
        duration_s = 1800.0

        def gpu_load(self, gpu, t):
            return GpuLoad(96.0 if t >= 60 else 0.0, job if t >= 60 else None)

        def gpu_util_pct(self, gpu, t):
            return 96.0 if t >= 60 else 0.0

    res = loop.run(shipped_profiles()["rtx4090"], One(), 1800, policy=policy(), progress=True)
    assert res.gain_pct() > 5.0 and 1.0 < res.slowdown_pct() < 4.5
    assert 125.0 < res.changes[-1][2] <= 150.0


def test_a_window_in_which_the_job_went_away_gives_no_verdict():
    """A job that ends (or pauses) mid-window would read as a huge miss; it is measured again instead, at
    the same limit — but at most twice in a row, so a job that is always half away is still judged."""
    spec = Spec(measure_s=30.0)
    s, _ = drive(spec, Job1(), 100)
    assert s.phase in (SNAP, STEP)
    limit, history = s.limit, s.history

    class Gone:
        def at(self, limit):
            return 25.0, 0.01

    class Ends:
        """Runs for 20 s of each window, then idles."""

        def __init__(self):
            self.n = 0

        def at(self, limit):
            self.n += 1
            return Job1().at(limit) if self.n % 33 < 20 else Gone().at(limit)

    job = Ends()
    s, limits = drive(spec, job, 2 * 33 + 1, t0=100.0, state=replace(s, acc=efficient.Acc(100.0)))
    assert set(limits) == {limit} and s.history == history and "away" in s.why and s.redos == 2
    s, limits = drive(spec, job, 40, t0=200.0, state=s)
    assert s.history != history  # the third in a row is judged


@pytest.mark.parametrize("progress", [True, False])  # the job's own rate; memory utilization
def test_memory_bound_decode_gets_the_search_on_a_locked_sm_clock(progress):
    """LLM decode draws far below any cap (no power limit binds): balanced's memory-bound state searches
    the top of a locked SM clock instead, down while the job keeps 98 % of its speed, with at most one
    back-off; the lock saves energy the power limit could not."""
    from pathlib import Path

    from aithermd.sim.workload import CycleWorkload

    balanced = load_policy_text((Path(__file__).parents[2] / "policies" / "balanced.yaml").read_text(),
                                name="balanced")
    w = CycleWorkload(idle_before_s=60.0, training_s=1800.0, idle_after_s=0.0, seed=1001, busy_kind="decode")
    prof = shipped_profiles()["h100"]
    res = loop.run(prof, w, 1860.0, policy=balanced, progress=progress)
    clocks = [c for c in res.clock_changes if c[3] == "balanced/memory-bound-clocks"]
    assert clocks and all("efficient clock" in c[4] for c in clocks)
    tops = [c[2] for c in clocks]
    ups = sum(1 for a, b in zip(tops, tops[1:], strict=False) if b > a)
    assert ups <= 1 and min(tops) < prof.max_sm_clock_mhz
    assert not [c for c in res.changes if c[3] == "balanced/busy-limit"]  # no power-limit search on decode
    assert res.gain_pct() > 10.0 and res.slowdown_pct() < 3.0



class Overshoot:
    """A power-bound job: its 1 s readings sit at the limit, every third one 2 % over it (the driver's power
    loop settling after a load step), and its speed does not depend on the limit."""

    def __init__(self):
        self.n = 0

    def at(self, limit):
        self.n += 1
        return limit * (1.02 if self.n % 3 == 0 else 0.99), 1.0


def test_the_baseline_peak_is_never_over_the_limit_in_force():
    """attack9 T7: the peak was the raw highest reading; a GPU holds no draw over its enforced limit, so the
    baseline's peak (explain's peak_draw_w) is at most that limit: 450 W here, not 459 W."""
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s, limits = drive(spec, Overshoot(), 90)
    assert s.phase == STEP and s.peak == 450
    assert efficient.explain(s, spec)[1]["peak_draw_w"] == 450
    assert limits[-1] < 450.0  # a step down from the default, as before: no snap to a peak at the limit
