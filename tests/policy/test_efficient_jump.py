"""A power search on the progress rate reaches its settled limit sooner: it jumps from the baseline straight
to where the Zeus sweeps' median job loses half the budget, then steps toward the budget's edge that each
kept window predicts; and a job that stops while the search is settled reads as such in the explanation
(fake clock: each tick is one simulated second handed to efficient.step)."""

from __future__ import annotations

import math

import pytest

from aithermd.model import Reading
from aithermd.policy import efficient
from aithermd.policy.efficient import BASELINE, SETTLED, STEP, Spec
from aithermd.policy.search_window import edge_cap, zeus_cap, zeus_loss

OWN = 300.0  # the job's own draw (W) on a 450 W card, at 95 % utilization


def readings(power, util, rate):
    return {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
            "gpu0/progress_rate": Reading("gpu0/progress_rate", rate)}


def drive(job, seconds, spec, s=None, t0=0):
    """``job(limit, t)`` → (power W, utilization %, progress steps/s); the card applies every limit at once.
    Returns the search and the limits it asked for, in order (each once)."""
    if s is None:
        s = efficient.start(spec, "gpu0", 0.0, 450.0, readings(*job(450.0, 0)))
        assert s is not None and s.signal == "progress"
    limits = [s.limit]
    for n in range(t0, t0 + seconds):
        s = efficient.step(spec, s, "gpu0", float(n + 1), readings(*job(s.limit, n + 1)), {}, 150.0, s.limit)
        if s.limit != limits[-1]:
            limits.append(s.limit)
    return s, limits


def zeus_job(lam, swing=0.0, period_s=150.0):
    """A job whose throughput under a cap follows the Zeus sweeps' median curve scaled by ``lam`` (its loss
    ∝ λ), its rate swinging ±``swing`` over ``period_s`` (a demand phase the cap does not cause)."""
    def job(limit, t):
        r = 1.0 if limit >= 450.0 else math.exp(-lam * zeus_loss(limit / OWN))
        return min(OWN, 0.95 * limit), 95.0, 3.0 * r * (1.0 + swing * math.sin(2 * math.pi * t / period_s))
    return job


def cost(lam, limit):
    return 1.0 - math.exp(-lam * zeus_loss(limit / OWN))


def test_the_zeus_curve_and_the_edge_it_predicts():
    assert zeus_loss(1.0) == pytest.approx(-math.log(0.975)) and zeus_loss(1.3) == 0.0
    assert zeus_cap(-math.log(0.948)) == pytest.approx(0.9, abs=1e-6)
    # a job that kept 97.5 % at its own draw is the median one: it loses 5 % at 0.9 of its draw
    assert edge_cap(0.975, 1.0, 1 - 0.948) == pytest.approx(0.9, abs=1e-6)
    # one that kept only 95 % there is twice as sensitive: 5 % is its edge
    assert edge_cap(0.95, 1.0, 0.05) == pytest.approx(1.0, abs=1e-6)


def test_the_first_step_jumps_to_where_the_median_job_loses_half_the_budget():
    for budget, want in ((0.03, 1.05), (0.05, 1.0)):
        s, limits = drive(zeus_job(1.0), 64, Spec(budget=budget, step=0.04, measure_s=60.0))
        # no snap to the peak draw and no long steps above the own draw: one window from the baseline
        assert s.phase == STEP and len(limits) == 2 and limits[1] == pytest.approx(want * OWN, abs=0.5)
        assert "where the Zeus sweeps' median job loses" in s.why


def test_an_insensitive_job_settles_at_its_budgets_edge_in_four_windows():
    spec = Spec(budget=0.05, step=0.04, measure_s=60.0)
    s, limits = drive(zeus_job(0.5), 64 * 4, spec)
    # baseline, jump (98.7 %), a step of 3 × 4 % toward the edge it predicts (97.0 %), the miss at 233 W
    # reading exactly the budget's edge: settled within four windows, the old search took nine
    assert s.phase == SETTLED and limits[:3] == [450.0, 299.6, 263.6] and len(s.history) == 4
    assert 0.045 <= cost(0.5, s.limit) <= 0.0501
    assert s.backoffs <= 1 and all(b <= a for a, b in zip(limits[1:-1], limits[2:-1], strict=False))


@pytest.mark.parametrize("period_s", [90.0, 150.0, 300.0])
def test_a_swinging_demand_does_not_settle_past_the_budget(period_s):
    spec = Spec(budget=0.05, step=0.04, measure_s=120.0)
    s, limits = drive(zeus_job(1.0, swing=0.05, period_s=period_s), 124 * 9, spec)
    assert s.phase == SETTLED and cost(1.0, s.limit) <= 0.05 + 0.005
    ups = sum(1 for a, b in zip(limits, limits[1:], strict=False) if b > a)
    assert ups <= 1  # monotone, with at most one back-off


def test_a_job_that_stops_while_settled_reads_as_ended_not_as_a_new_phase():
    spec = Spec(budget=0.05, step=0.04, measure_s=60.0)
    s, _ = drive(zeus_job(1.0), 64 * 4, spec)
    assert s.phase == SETTLED
    # the job ends: the GPU idles at 30 W while its progress rate still reads (a feed that lags), high
    # (a window with the job away is measured again, twice at most, then judged)
    t = 64 * 4
    while s.phase == SETTLED and t < 64 * 4 + 4 * 124:
        t += 1
        s = efficient.step(spec, s, "gpu0", float(t), readings(30.0, 0.0, 3.3), {}, 150.0, s.limit)
    limits = [s.limit]
    assert s.phase == BASELINE and limits[-1] == 450.0
    assert s.why.startswith("the job ended or paused (the GPU idle at 0 % over the last 15 s)")
    assert "throughput moved" not in s.why and "lighter" not in s.why
