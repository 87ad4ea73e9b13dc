"""One measurement window of the efficient-limit search (:mod:`aithermd.policy.efficient`). Pure.

The search reads its job's throughput signal and power once a tick over a window of ``measure_s``
seconds: :class:`Acc` keeps the window's samples and gives their mean (trimmed of a job's own stalls and
bursts), the share of seconds the job was away, and the chance error of the mean (:meth:`Acc.spread`; of a
progress rate per busy second, :meth:`Acc.rate_spread`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aithermd.model import Reading, Status

TRIM = 0.1  # share of a window's seconds left out at each end of the signal's range (Acc.mean)
AWAY = 0.4  # a second drawing under this share of the window's running draw (its 90th percentile) is away
BLOCK_S = 20.0  # seconds per block of a window: their means give its standard error (spread, rate_spread)
STALL = 0.75  # a block of a progress window under this share of the window's median block: a stall (stalled)
HELD = 0.05  # a power reading with another within this share under it is a peak the job held (held_peak)


@dataclass(frozen=True, slots=True)
class Acc:
    """One measurement window from ``t0`` (after the settle time): each sample's (seconds it covers,
    signal, power, utilization %) and the last sample time."""

    t0: float
    last: float | None = None
    samples: tuple[tuple[float, float, float, float], ...] = ()
    span: float = 0.0  # the seconds the samples cover (kept as they come: read every tick)

    def add(self, t: float, signal: float, power: float, util: float = 100.0) -> Acc:
        """The window with the sample at ``t`` (s): ``signal``, ``power`` (W), ``util`` (utilization, %;
        only :meth:`rate_spread` reads it). Before ``t0`` (settling) nothing is added."""
        if t < self.t0:
            return self
        dt = 1.0 if self.last is None else max(0.0, t - self.last)
        return Acc(self.t0, t, self.samples + ((dt, signal, power, util),), self.span + dt)

    def mean(self, trim: bool = True) -> tuple[float, float]:
        """Time-weighted mean signal and power over the window's seconds, with ``trim`` leaving out the
        :data:`TRIM` share with the lowest and with the highest signal: a data-loader stall or a burst
        of a few seconds is the job's own and the same at any limit, yet moves a 30 s mean of
        utilization × clock by percents. A progress rate is counted whole (whole steps per second:
        trimming a two-valued count would bias it)."""
        ranked = sorted(self.samples, key=lambda x: x[1])
        cut = int(TRIM * len(ranked)) if trim else 0
        kept = ranked[cut:len(ranked) - cut] or ranked
        span = sum(x[0] for x in kept)
        if span <= 0:
            return 0.0, 0.0
        return sum(x[0] * x[1] for x in kept) / span, sum(x[0] * x[2] for x in kept) / span

    def held_peak(self, ceiling: float | None = None) -> float:
        """The highest draw (W) the job held in the window: its highest power reading with another within
        :data:`HELD` under it (one reading alone, a glitch or a burst within the second, is no peak a job
        holds: attack9 T7, one 2x reading cancelled the search's snap), else the second-highest (the only
        one of a one-sample window); never over ``ceiling`` (the limit in force while it was measured: a
        GPU draws no more than its enforced limit for long). 0.0 for an empty window."""
        powers = sorted((x[2] for x in self.samples), reverse=True)
        if not powers:
            return 0.0
        peak = next((a for a, b in zip(powers, powers[1:], strict=False) if b >= (1.0 - HELD) * a),
                    powers[min(1, len(powers) - 1)])
        return peak if ceiling is None else min(peak, ceiling)

    def away(self) -> float:
        """The share of the window's seconds the job was away: drawing under :data:`AWAY` of the window's
        running draw (its 90th percentile power). A power cap never does that (a search's floor is 60 % of
        the own draw): a job that ended or paused does."""
        powers = sorted(x[2] for x in self.samples)
        if not powers or self.span <= 0:
            return 0.0
        running = powers[min(len(powers) - 1, int(0.9 * len(powers)))]
        return sum(x[0] for x in self.samples if x[2] < AWAY * running) / self.span

    def spread(self, trim: bool = True) -> float:
        """The standard error of the window's mean signal, relative to that mean: how far a window of this
        job reads off its true throughput by chance. A progress rate (``trim`` False) counts its seconds as
        independent (the same seconds as :meth:`mean`); the other signals follow the job's demand, which
        swings over tens of seconds, so consecutive seconds are alike and that count would understate the
        error several times: their error comes from the means of :data:`BLOCK_S` blocks of the window (the
        batch-means estimate of a correlated series' error; the trimmed share is left out of neither)."""
        if trim:
            blocks, cur, span = [], [], 0.0
            for dt, sg, _p, _u in self.samples:
                cur.append(sg)
                span += dt
                if span >= BLOCK_S - 1e-9:
                    blocks.append(sum(cur) / len(cur))
                    cur, span = [], 0.0
            return _se(blocks)
        return _se([x[1] for x in self.samples])

    def rate_spread(self) -> float:
        """The standard error of a progress rate per busy second (steps over utilization), relative to its
        mean, from :data:`BLOCK_S` blocks: each block's steps over its utilization-seconds. A rate counts
        whole steps, so its seconds alternate (a second short one step, the next one over) and their own
        spread (:meth:`spread`) overstates the error of a window several times; a block's count is off by
        at most one step, and what moves a block beyond that (the job's stalls, its demand under a cap)
        moves the window. The partial last block is left out; 0 with fewer than two blocks."""
        return _se(self._rate_blocks())

    def stalled(self) -> bool:
        """Whether a :data:`BLOCK_S` block of the window made under :data:`STALL` of the window's median
        block's progress per busy second: the job stopped stepping while the GPU kept busy (a collective
        that hangs, a loader stall, an evaluation pass). A cap slows every block alike, so that is the job's
        own and such a window reads neither the job nor the cap (a clean job's blocks sit within ~4 % of
        their median: the benchmark's training jobs)."""
        blocks = sorted(self._rate_blocks())
        return len(blocks) >= 2 and blocks[0] < STALL * blocks[len(blocks) // 2]

    def _rate_blocks(self) -> list[float]:
        blocks, steps, busy, span = [], 0.0, 0.0, 0.0
        for dt, sg, _p, util in self.samples:
            steps += dt * sg
            busy += dt * util
            span += dt
            if span >= BLOCK_S - 1e-9:
                if busy > 0:
                    blocks.append(steps / busy)
                steps, busy, span = 0.0, 0.0, 0.0
        return blocks

    def recent_util(self, seconds: float) -> float | None:
        """Mean utilization (%) over the window's last ``seconds`` (None before any sample)."""
        busy = span = 0.0
        for dt, _sg, _p, util in reversed(self.samples):
            busy, span = busy + dt * util, span + dt
            if span >= seconds:
                break
        return busy / span if span > 0 else None


def _se(values: list[float]) -> float:
    """The standard error of the mean of ``values``, relative to that mean (0 for fewer than 2)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return (var / len(values)) ** 0.5 / mean if mean > 0 else 0.0


# What a cap costs the median training job on the Zeus power-limit sweeps (measured, 119 binding
# configurations; aithermd/sim/CALIBRATION.md section 1): (cap as a share of the job's own draw, median
# slowdown). Below 0.8 the last slope goes on; at 1.2 × the own draw a cap no longer binds.
ZEUS_COST = ((0.6, 0.163), (0.8, 0.089), (0.9, 0.052), (1.0, 0.025), (1.1, 0.005), (1.2, 0.0))


def zeus_loss(x: float) -> float:
    """−ln(throughput ratio) of the Zeus sweeps' median job under a cap at ``x`` × its own draw
    (:data:`ZEUS_COST`, linear between its points; 0 above 1.2, the last slope below 0.6)."""
    pts = ZEUS_COST
    if x >= pts[-1][0]:
        return 0.0
    (x0, c0), (x1, c1) = next(((a, b) for a, b in zip(pts, pts[1:], strict=False) if x < b[0]),
                              (pts[0], pts[1]))
    cost = c0 + (c1 - c0) * (x - x0) / (x1 - x0)
    return -math.log(1.0 - min(cost, 0.9))


def zeus_cap(loss: float) -> float:
    """The cap (share of the own draw) at which the Zeus median job loses ``loss`` (−ln of its
    throughput ratio): the inverse of :func:`zeus_loss` (1.2 for no loss)."""
    lo, hi = 0.3, 1.2
    for _ in range(40):  # zeus_loss falls with x: bisection
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if zeus_loss(mid) > loss else (lo, mid)
    return hi


def edge_cap(ratio: float, x: float, budget: float, least: float = 0.25) -> float:
    """The cap (share of the own draw) at which a job that kept ``ratio`` of its throughput under a cap at
    ``x`` × its own draw loses the whole ``budget`` (a share): its sensitivity λ (its loss over the Zeus
    median job's at ``x``, at least ``least``; the Zeus p10 is about 0.5) scales the Zeus shape (a cap's
    loss ∝ λ: the law of CALIBRATION section 1)."""
    lam = max(least, -math.log(max(ratio, 0.05)) / max(zeus_loss(x), 1e-3))
    return zeus_cap(-math.log(1.0 - budget) / lam)


def value_of(r: Reading | None) -> float | None:
    """The reading's value when it reads OK and finite, else None."""
    if r is None or r.status != Status.OK or r.value is None or not math.isfinite(r.value):
        return None
    return float(r.value)


def read_signal(kind: str, gpu: str, readings: Mapping[str, Reading]) -> float | None:
    """The throughput signal ``kind`` of ``gpu`` this tick, or None when it cannot be read."""
    if kind == "progress":
        return value_of(readings.get(f"{gpu}/progress_rate"))
    if kind == "memory":
        return value_of(readings.get(f"{gpu}/memory_utilization"))
    clock = value_of(readings.get(f"{gpu}/sm_clock"))
    other = value_of(readings.get(f"{gpu}/tensor_activity" if kind == "gpm" else f"{gpu}/utilization"))
    return None if clock is None or other is None else clock * other


def proxy_ratio(raw: float, mem: float) -> float:
    """The throughput ratio that a ratio ``raw`` of utilization × SM clock stands for in a job whose time is
    a share ``mem`` memory-bound (Amdahl: that share does not slow with the SM clock): ``1 / ((1 − mem) /
    raw + mem)``. The clock alone overstates a cap's cost: a job 40 % memory-bound whose clock falls 5 %
    loses 3 %, not 5 % (the roofline; Ivanov et al., MLSys 2021, for the memory-bound share of training)."""
    if mem <= 0.0 or raw <= 0.0:
        return raw
    return 1.0 / ((1.0 - mem) / raw + mem)


@lru_cache(maxsize=64)
def explain_text(clocks: bool, budget: float, phase: str, signal: str, why: str, history: tuple, own: float,
                 peak: float, best_ratio: float, best_eff: float,
                 base_eff: float) -> tuple[str, dict[str, Any]]:
    """A search's reason text and decision inputs (:func:`aithermd.policy.efficient.explain`): ``clocks`` a
    clock search (MHz) or a power one (W), ``budget`` a share, ``history`` (limit, ratio, gain, verdict)."""
    # every tick asks, the answer changes once a window: the text is built once per change
    unit = "MHz" if clocks else "W"
    steps = "; ".join(f"{lim:g} {unit} {verdict}" + (f" {100 * r:.1f} %, {100 * g:+.1f} %/J"
                                                  if verdict in ("keep", "miss") else "")
                      for lim, r, g, verdict in history)
    inputs: dict[str, Any] = {"search": phase, "signal": signal,
                              "budget_pct": round(100 * budget, 2), "steps": steps or "none yet"}
    if own:
        inputs.update(own_draw_w=round(own, 1), peak_draw_w=peak,
                      slowdown_pct=round(100 * (1 - best_ratio), 2),
                      gain_pct=round(100 * (best_eff / base_eff - 1), 2) if base_eff else 0.0)
    what = "efficient clock" if clocks else "efficient limit"
    text = f"{what} ({phase}, signal {signal}): {why}"
    return text, inputs
