"""The efficient-limit search's use of its time and of the proxy: longer steps while the limit is above the
job's own draw, and utilization × SM clock read through the job's memory-bound share (fake clock: each
tick is one simulated second handed to efficient.step)."""

from __future__ import annotations

import math
import statistics

import pytest

from aithermd.model import Reading
from aithermd.policy import efficient
from aithermd.policy.efficient import BASELINE, SNAP, STEP, Spec


def readings(power, clock, util=95.0, mem=None):
    out = {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
           "gpu0/sm_clock": Reading("gpu0/sm_clock", clock)}
    if mem is not None:
        out["gpu0/memory_utilization"] = Reading("gpu0/memory_utilization", mem)
    return out


def run(spec, job, seconds, mem=None):  # mem: memory utilization %, or limit → it
    """``job(limit, tick)`` → (power W, clock MHz); the card applies every limit at once."""
    s = efficient.start(spec, "gpu0", 0.0, 450.0, readings(300.0, 2500.0))
    limits, t = [], 0.0
    for n in range(seconds):
        t += 1.0
        power, clock = job(s.limit, n)
        m = mem(s.limit) if callable(mem) else mem
        s = efficient.step(spec, s, "gpu0", t, readings(power, clock, mem=m), {}, 150.0, s.limit)
        if not limits or limits[-1] != s.limit:
            limits.append(s.limit)
    return s, limits


def bursty(limit, n):
    """Draws 300 W on average in bursts of 240 and 360 W (its 1 s peak 360 W); a cap costs it nothing down to
    its own draw and then 0.3 % of speed per 1 % of power."""
    power = min(240.0 if n % 2 else 360.0, 0.99 * limit)
    return power, 2500.0 * min(1.0, limit / 300.0) ** 0.3


def test_steps_are_twice_as_long_while_the_limit_stays_above_the_own_draw():
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s, limits = run(spec, bursty, 400)
    assert s.own == pytest.approx(300.0, abs=5.0) and s.peak == 360
    step = spec.step * s.own
    # snap to the peak, then two steps' length while the next limit stays above the own draw, then one step
    assert limits[:2] == [450.0, 360.0]
    assert limits[2] == pytest.approx(360.0 - 2 * step, abs=0.1)
    assert limits[3] == pytest.approx(360.0 - 4 * step, abs=0.1)
    below = [b for a, b in zip(limits[3:], limits[4:], strict=False)]
    assert below and all(a - b == pytest.approx(step, abs=0.1)
                         for a, b in zip(limits[3:], below, strict=False) if b < a)


def test_below_the_own_draw_the_steps_keep_their_length():
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s, limits = run(spec, lambda limit, n: (min(300.0, 0.95 * limit), 2500.0 * min(1.0, 0.95 * limit / 300.0)
                                            ** 0.3), 600)
    downs = [a - b for a, b in zip(limits[1:], limits[2:], strict=False) if b < a]
    assert downs and all(d == pytest.approx(spec.step * s.own, abs=0.1) for d in downs)


def test_the_proxy_is_read_through_the_memory_bound_share():
    assert efficient.proxy_ratio(0.95, 0.0) == 0.95
    assert efficient.proxy_ratio(0.95, 0.2) == pytest.approx(1.0 / (0.8 / 0.95 + 0.2))
    assert efficient.proxy_ratio(1.0, 0.3) == pytest.approx(1.0)
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)

    def job(limit, n):  # the SM clock falls 3.5 % once the cap binds: the proxy reads a 3.5 % slowdown
        return min(300.0, 0.95 * limit), 2500.0 * (1.0 if limit >= 450.0 else 0.965)

    plain, _ = run(spec, job, 2 * 33 + 34)  # baseline, then the snap's window
    assert plain.mem == 0.0 and plain.history[-1][:2] == (300.0, 0.965) and plain.history[-1][3] == "miss"
    assert plain.limit == 375.0  # the snap missed: halfway back up
    # the same job showing memory busy 40 % of the time it is busy, its memory traffic holding while the
    # clock falls (memory-stalled: the traffic confirms the share): the whole 40 % counts, and a 3.5 % lower
    # clock is a 2.1 % slowdown — within the budget
    s, _ = run(spec, job, 2 * 33 + 34, mem=0.4 * 95.0)
    assert s.mem == pytest.approx(0.5 * 0.4, abs=1e-6) and s.mem_top == pytest.approx(0.4, abs=1e-6)
    assert s.base_mem == pytest.approx(38.0)
    assert s.phase == STEP and s.history[-1][3] == "keep"
    assert s.history[-1][1] == pytest.approx(efficient.proxy_ratio(0.965, 0.4), abs=1e-3)


@pytest.mark.parametrize(("traffic", "ratio"), [
    (1.0, 1.0 / (0.6 / 0.965 + 0.4)),  # held: the whole measured share (0.9787)
    (0.975, 0.975),                     # partway: what the traffic shows
    (0.965, 1.0 / (0.8 / 0.965 + 0.2)),  # fell with the clock (overlapped, compute-bound): half (0.9718)
])
def test_the_memory_traffic_decides_how_much_of_the_memory_share_counts(traffic, ratio):
    """Memory traffic per unit of work is fixed, so the memory utilization of a window follows the job's
    throughput: the proxy counts up to the whole memory-busy share where the traffic confirms it, never less
    than MEM_TRUST of it."""
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)

    def job(limit, n):
        return min(300.0, 0.95 * limit), 2500.0 * (1.0 if limit >= 450.0 else 0.965)

    s, _ = run(spec, job, 2 * 33 + 34, mem=lambda limit: 38.0 * (1.0 if limit >= 450.0 else traffic))
    assert s.history[-1][:2] == (300.0, pytest.approx(ratio, abs=1e-4)) and s.history[-1][3] == "keep"


def test_a_proxy_windows_error_comes_from_block_means():
    """Per-second proxy readings follow the job's demand, which swings over tens of seconds: 20 s block
    means give the window's error; a progress rate's whole-step counts are counted second by second."""
    swing = [100.0 * (1.0 + 0.05 * math.sin(2 * math.pi * n / 60.0)) for n in range(120)]
    acc = efficient.Acc(0.0)
    for n, v in enumerate(swing):
        acc = acc.add(float(n), v, 300.0)
    blocks = [statistics.fmean(swing[i:i + 20]) for i in range(0, 120, 20)]
    want = statistics.stdev(blocks) / len(blocks) ** 0.5 / statistics.fmean(blocks)
    assert acc.spread() == pytest.approx(want, rel=1e-9) and want == pytest.approx(0.0131, abs=1e-4)
    iid = statistics.stdev(swing) / 120 ** 0.5 / statistics.fmean(swing)
    assert acc.spread(trim=False) == pytest.approx(iid, rel=1e-9) and want > 4 * iid
    # a reading that jitters second by second around a steady mean: every block reads the mean
    steady = efficient.Acc(0.0)
    for n in range(120):
        steady = steady.add(float(n), 99.0 if n % 2 else 101.0, 300.0)
    assert steady.spread() == pytest.approx(0.0, abs=1e-12)
    assert steady.spread(trim=False) == pytest.approx((120 / 119) ** 0.5 / 120 ** 0.5 / 100.0, rel=1e-9)


@pytest.mark.parametrize(("amplitude", "verdict"), [(0.0, "miss"), (0.1, "keep")])
def test_a_proxy_step_misses_only_beyond_its_windows_error(amplitude, verdict):
    """A step reading 96.2 % of the baseline, 0.8 % short of a 3 % budget: a steady job's windows are
    exact, so it misses; a job whose demand swings ±10 % a minute reads each 120 s window only to about a
    percent, and half of that error covers the shortfall (MISS_Z): no evidence of a miss, kept."""
    spec = Spec(budget=0.03, step=0.04, measure_s=120.0)

    def job(limit, n):
        wave = 1.0 + amplitude * math.sin(2 * math.pi * n / 60.0)
        return min(300.0, 0.95 * limit), 2500.0 * wave * (1.0 if limit >= 450.0 else 0.962)

    s, _ = run(spec, job, 2 * 123 + 124)
    assert s.history[1][0] == 300.0 and s.history[1][1] == pytest.approx(0.962, abs=2e-3)
    assert s.history[1][3] == verdict


def test_the_exact_signals_are_never_corrected():
    spec = Spec(budget=0.03, step=0.04, measure_s=30.0)
    s = efficient.start(spec, "gpu0", 0.0, 450.0, {**readings(300.0, 2500.0),
                                                    "gpu0/progress_rate": Reading("gpu0/progress_rate", 3.0)})
    assert s.signal == "progress"
    t = 0.0
    for _ in range(70):
        t += 1.0
        r = {**readings(300.0, 2500.0, mem=60.0), "gpu0/progress_rate": Reading("gpu0/progress_rate", 3.0)}
        s = efficient.step(spec, s, "gpu0", t, r, {}, 150.0, s.limit)
    assert s.phase in (SNAP, STEP, BASELINE) and s.mem == 0.0
