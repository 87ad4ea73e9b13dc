"""The efficient-limit search reads a job's progress rate per busy second: its own loader stalls, which differ
from one window to the next, do not read as the cap's cost, and a real cost still does (fake clock: each
tick is one simulated second handed to efficient.step)."""

from __future__ import annotations

import pytest

from aithermd.model import Reading
from aithermd.policy import efficient
from aithermd.policy.efficient import SETTLED, SNAP, STEP, Spec

SPEC = Spec(budget=0.03, step=0.04, measure_s=30.0)


def readings(power, util, rate):
    return {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
            "gpu0/sm_clock": Reading("gpu0/sm_clock", 2500.0),
            "gpu0/progress_rate": Reading("gpu0/progress_rate", rate)}


def run(job, seconds, spec=SPEC):
    """``job(limit)`` → (power W, utilization %, progress steps/s); the card applies every limit at once."""
    s = efficient.start(spec, "gpu0", 0.0, 450.0, readings(*job(450.0)))
    assert s is not None and s.signal == "progress"
    for n in range(seconds):
        s = efficient.step(spec, s, "gpu0", float(n + 1), readings(*job(s.limit)), {}, 150.0, s.limit)
    return s


def stalls_more_after_the_baseline(cost_at_300):
    """300 W of own draw at 95 % utilization while measured at the default; from the first step on its loader
    stalls more (85 %), and a cap at 300 W costs ``cost_at_300`` of its speed per busy second."""
    def job(limit):
        util = 95.0 if limit >= 450.0 else 85.0
        cost = 1.0 if limit >= 450.0 else cost_at_300
        return min(300.0, 0.95 * limit), util, 3.0 * util / 95.0 * cost
    return job


def test_a_window_with_more_stalls_is_not_read_as_the_caps_cost():
    s = run(stalls_more_after_the_baseline(1.0), 33 + 34)  # the baseline's window, then the jump's
    assert s.base_util == pytest.approx(95.0) and s.own == pytest.approx(300.0)
    first = s.history[1]
    # the rate fell to 85/95 = 89.5 % of the baseline's: the stalls; per busy second it is the same
    assert first[0] == 314.8 and first[1] == pytest.approx(1.0, abs=1e-4) and first[3] == "keep"
    # 100 %: none of the budget used, so the next step is the longest, 3 × 4 % of the own draw (MAX_JUMP)
    assert s.phase == STEP and s.limit == pytest.approx(314.8 - 3 * 0.04 * 300.0)


def test_a_real_cost_still_misses_per_busy_second():
    s = run(stalls_more_after_the_baseline(0.95), 33 + 34)
    first = s.history[1]
    assert first[0] == 314.8 and first[1] == pytest.approx(0.95, abs=1e-4) and first[3] == "miss"
    # back up to where the line from the baseline to the miss crosses 97 %: the one back-off, settled
    assert s.phase == SETTLED and s.limit == 368.9 and s.backoffs == 1


def test_the_clock_search_and_the_proxies_read_their_signal_as_it_is():
    clocks = Spec(budget=0.02, step=0.05, measure_s=30.0, floor=0.1, clocks=True)
    s = run(stalls_more_after_the_baseline(1.0), 2 * 33 + 1, spec=clocks)
    assert s.base_util == 0.0 and s.phase == STEP
    proxy = Spec(budget=0.03, step=0.04, measure_s=30.0, signal="proxy")
    p = efficient.start(proxy, "gpu0", 0.0, 450.0, readings(300.0, 95.0, 3.0))
    for n in range(2 * 33 + 1):
        p = efficient.step(proxy, p, "gpu0", float(n + 1), readings(300.0, 95.0, 3.0), {}, 150.0, p.limit)
    assert p.signal == "proxy" and p.base_util == 0.0 and p.phase == SNAP
