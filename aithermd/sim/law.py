"""What a power limit costs a training job and saves it: the law fitted on the Zeus sweeps. Pure.

Everything is relative to the job's **own draw** ``D``: the mean power it draws when no limit binds. Caps
are ``x = limit / D``; drawn power is ``u = mean power / D``; throughput ``r`` is relative to the unbound
run. Two measured facts make the law (the fit, its errors and the data: ``CALIBRATION.md``):

1. **Drawn power under a cap** is a soft minimum of a line and 1, with a per-job slope ``s`` (a job whose
   power swings hard above its mean is cut below the cap on average: the driver holds the average under
   the cap)::

       u = m(x) = (1 + (s·(x + D))^-K)^(-1/K)

   A cap at the job's own draw (x = 1) leaves it drawing ~0.89 D, and every 0.1 D lower cap takes
   another ~0.08 D: jobs draw in bursts. There is no gain above the own draw: u ≤ 1 and r ≤ 1 whatever
   the limit.
2. **Throughput against drawn power** has a gentle slope where a controller works and a knee at deep
   caps, where clocks are at their floor and only voltage-less frequency cuts remain::

       ln r = λ · ( A·ln u )                          u ≥ U_KNEE
       ln r = λ · ( A·ln U_KNEE + B·ln(u/U_KNEE) )    u < U_KNEE

   ``λ`` is each job's own sensitivity (the spread between jobs: p10 ≈ 0.5, median ≈ 1, p90 ≈ 2).

``A``, ``U_KNEE``, ``B``, ``K``, ``D`` and the per-job (λ, s) table come from :mod:`aithermd.sim.law_fit`,
written by ``scripts/fit-sim-law``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from aithermd.sim import law_fit

A, U_KNEE, B, K, D = law_fit.A, law_fit.U_KNEE, law_fit.B, law_fit.K, law_fit.D
# Mean power never exceeds the cap by more than this at the deepest caps: the cards' floors (the Zeus
# sweeps: 95 % of the points under 0.9 × the own draw draw at most 1.04 × the cap, the worst 1.21 ×).
OVER_CAP = 1.1


@dataclass(frozen=True, slots=True)
class JobLaw:
    """One job's place in the law: ``lam`` (λ, its throughput sensitivity) and ``s`` (its drawn-power
    shape); ``key`` names the Zeus configuration it was fitted on ("" for a synthetic one)."""

    lam: float = 1.0
    s: float = law_fit.S_MEDIAN
    key: str = ""

    def drawn(self, x: float) -> float:
        """u: mean power / own draw under a cap at ``x`` × own draw (x > 0); at most 1."""
        return drawn_ratio(x, self.s)

    def throughput(self, u: float) -> float:
        """r: throughput / unbound throughput while drawing ``u`` × own draw; 1 for u ≥ 1."""
        return throughput_ratio(u, self.lam)

    def at_cap(self, x: float) -> tuple[float, float]:
        """(u, r) under a cap at ``x`` × own draw."""
        u = self.drawn(x)
        return u, self.throughput(u)

    def power_for(self, r: float) -> float:
        """The drawn power u at which this job keeps throughput ``r`` (0 < r ≤ 1): the inverse of
        :meth:`throughput`, used when something other than a power cap sets the clock."""
        return power_for_throughput(r, self.lam)


def drawn_ratio(x: float, s: float) -> float:
    """m(x) = (1 + (s·(x + D))^-K)^(-1/K), at most :data:`OVER_CAP` × x; 0 for x ≤ 0."""
    if x <= 0:
        return 0.0
    sx = s * (x + D)
    if sx <= 0:
        return 0.0
    m = (1.0 + sx ** -K) ** (-1.0 / K) if sx < 1e6 else 1.0
    return min(m, OVER_CAP * x)


def log_throughput(u: float) -> float:
    """ℓ(u): the population's ln r at drawn power ``u`` (0 < u; 0 for u ≥ 1)."""
    if u >= 1.0:
        return 0.0
    if u >= U_KNEE:
        return A * math.log(u)
    return A * math.log(U_KNEE) + B * math.log(max(u, 1e-9) / U_KNEE)


def throughput_ratio(u: float, lam: float) -> float:
    """r = exp(λ · ℓ(u))."""
    return math.exp(lam * log_throughput(u))


def power_for_throughput(r: float, lam: float) -> float:
    """u such that :func:`throughput_ratio` (u, λ) = r; 1 for r ≥ 1 or λ = 0."""
    if r >= 1.0 or lam <= 0:
        return 1.0
    target = math.log(max(r, 1e-9)) / lam
    at_knee = A * math.log(U_KNEE)
    if target >= at_knee:
        return math.exp(target / A)
    return U_KNEE * math.exp((target - at_knee) / B)


def fitted_jobs(*, held_out: bool | None = None) -> list[JobLaw]:
    """The (λ, s) of every Zeus configuration the law was fitted on or held out from (``held_out`` True:
    only held-out ones, False: only fitted ones, None: all)."""
    return [JobLaw(lam, s, key) for key, lam, s, _draw, out in law_fit.JOBS
            if held_out is None or out == held_out]


def population_at(x: float, jobs: Iterable[JobLaw]) -> dict[str, float]:
    """The law's answer for a cap at ``x`` × own draw over ``jobs``: median and p90 slowdown, median gain
    in work per joule (compare :func:`aithermd.sim.zeus.measured_at`)."""
    slow, gain = [], []
    for job in jobs:
        u, r = job.at_cap(x)
        slow.append(1.0 - r)
        gain.append(r / u - 1.0)
    slow.sort()
    return {"n": len(slow), "slowdown_median": statistics.median(slow),
            "slowdown_p90": slow[min(len(slow) - 1, int(0.9 * len(slow)))],
            "gain_median": statistics.median(gain)}
