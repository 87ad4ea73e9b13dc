"""How fast and how close to its budget's edge a power search on the progress rate settles: one baseline
window, the rate's standard error from block means, steps as long as the last window predicts (the first a
jump: test_efficient_jump.py), and a back-off to where the last two windows cross the budget (fake clock: each tick is one simulated second
handed to efficient.step)."""

from __future__ import annotations

import pytest

from aithermd.model import Reading
from aithermd.policy import efficient
from aithermd.policy.efficient import BASELINE, SETTLED, STEP, Spec
from aithermd.policy.search_window import Acc

SPEC = Spec(budget=0.03, step=0.04, measure_s=60.0)


def readings(power, util, rate):
    return {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
            "gpu0/sm_clock": Reading("gpu0/sm_clock", 2500.0),
            "gpu0/progress_rate": Reading("gpu0/progress_rate", rate)}


def drive(job, seconds, spec=SPEC, signal="progress"):
    """``job(limit, t)`` → (power W, utilization %, progress steps/s); the card applies every limit at once.
    Returns the search and the limits it asked for, in order (each once)."""
    s = efficient.start(spec, "gpu0", 0.0, 450.0, readings(*job(450.0, 0)))
    assert s is not None and s.signal == signal
    limits = [s.limit]
    for n in range(seconds):
        s = efficient.step(spec, s, "gpu0", float(n + 1), readings(*job(s.limit, n + 1)), {}, 150.0, s.limit)
        if s.limit != limits[-1]:
            limits.append(s.limit)
    return s, limits


def steady(limit, _t):
    """300 W of own draw at 95 % utilization, 3 steps per second at any limit."""
    return min(300.0, 0.95 * limit), 95.0, 3.0


def test_the_baseline_of_a_progress_search_is_one_window():
    s, limits = drive(steady, 64)  # settle 3 s, then 60 one-second samples
    # then the jump to 1.05 × the own draw (test_efficient_jump.py)
    assert s.phase == STEP and limits == [450.0, 314.8] and s.own == pytest.approx(300.0)
    # the proxies still read two windows at the default: their signal follows the job's demand
    p, limits = drive(steady, 64, spec=Spec(budget=0.03, step=0.04, measure_s=60.0, signal="proxy"),
                      signal="proxy")
    assert p.phase == BASELINE and limits == [450.0]


def test_the_rates_error_is_read_from_block_means_per_busy_second():
    acc = Acc(0.0)
    for n in range(60):  # whole steps: 2 and 4 in turn, a mean of 3 per second, at 95 % utilization
        acc = acc.add(float(n), 2.0 if n % 2 else 4.0, 300.0, 95.0)
    assert acc.rate_spread() == pytest.approx(0.0, abs=1e-12)  # every 20 s block made 60 steps
    assert acc.spread(trim=False) == pytest.approx(1.0 / 3.0 / 59 ** 0.5, rel=1e-9)  # the seconds' count
    wavy = Acc(0.0)
    for n in range(60):  # the same steps, the second block at 90 % utilization
        wavy = wavy.add(float(n), 2.0 if n % 2 else 4.0, 300.0, 90.0 if 20 <= n < 40 else 95.0)
    blocks = [3.0 / 95.0, 3.0 / 90.0, 3.0 / 95.0]
    mean = sum(blocks) / 3
    want = (sum((b - mean) ** 2 for b in blocks) / 2 / 3) ** 0.5 / mean
    assert wavy.rate_spread() == pytest.approx(want, rel=1e-9) and want == pytest.approx(0.0182, abs=1e-4)


def test_a_four_percent_cost_misses_a_three_percent_budget_when_the_count_is_steady():
    def job(limit, t):  # 2 and 4 steps in turn; any cap costs 4 %
        return min(300.0, 0.95 * limit), 95.0, (2.0 if t % 2 else 4.0) * (1.0 if limit >= 450.0 else 0.96)
    s, limits = drive(job, 3 * 64)
    # the seconds' own spread (2 and 4 steps) puts the error at 4 % and would keep 96 %; block means do not
    assert s.history[1][:2] == (314.8, 0.96) and s.history[1][3] == "miss"
    # back to where the line from the baseline (450 W, 100 %) to the miss crosses 97 %: a quarter of the way up
    assert limits == [450.0, 314.8, 348.6] and s.phase == SETTLED and s.backoffs == 1


def shallow_then_steep(limit, _t):
    """Free down to 300 W, 2 % slower down to 270 W, 5 % below."""
    cost = 1.0 if limit >= 300.0 else 0.98 if limit >= 270.0 else 0.95
    return min(300.0, 0.95 * limit), 95.0, 3.0 * cost


def test_steps_are_as_long_as_the_last_window_predicts():
    s, limits = drive(shallow_then_steep, 64 * 3)
    # the jump read 100 %: no cost, the least sensitivity, the longest step (3 × 4 % of the own draw); at
    # 278.8 W it read 98 %: the Zeus curve scaled to that puts the edge 1.7 steps lower
    assert limits == [450.0, 314.8, 278.8, 258.9] and s.phase == STEP
    assert [h[1] for h in s.history[1:]] == [pytest.approx(1.0), pytest.approx(0.98)]


def test_a_miss_settles_where_the_last_two_windows_cross_the_budget():
    s, limits = drive(shallow_then_steep, 64 * 4 + 5)
    # kept 98 % at 278.8 W, missed at 258.9 W with 95 %: 97 % lies two thirds of the way up, at 272.2 W
    assert s.history[-1][:2] == (258.9, 0.95) and s.history[-1][3] == "miss"
    assert limits == [450.0, 314.8, 278.8, 258.9, 272.2] and s.phase == SETTLED and s.best == 272.2
    assert s.backoffs == 1 and s.best_ratio == pytest.approx(0.97)
    # and it stays there: the watch reads 98 % at 272 W, within the budget of where it settled
    s, more = drive(shallow_then_steep, 64 * 4 + 5 + 2 * 64)
    assert more == limits and s.phase == SETTLED


def test_a_step_past_an_edge_within_one_step_says_so():
    """newuser7 #13: "step down to 243.8 W: 97.6 % at 254.2 W puts the budget's edge near 254 W" read as a
    step past the edge it had just found; the smallest step is taken to measure there, and the reason says so."""
    def near_edge(limit, _t):
        return min(300.0, 0.95 * limit), 95.0, 3.0 if limit > 400 else 3.0 * 0.976
    s, limits = drive(near_edge, 64 * 2 + 5)
    assert limits[:2] == [450.0, 314.8] and len(limits) == 3 and limits[2] == pytest.approx(314.8 - 12.0)
    assert s.why.startswith("step down to 302.8 W: 97.6 % at 314.8 W puts the budget's edge near 309 W")
    assert s.why.endswith(", less than one step (12.0 W) lower: one step to measure")
