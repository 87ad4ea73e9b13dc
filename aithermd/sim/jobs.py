"""The jobs a simulated GPU runs: each with a hidden truth the daemon never sees. Pure and seeded.

A job's truth: its own draw (W, when nothing binds), its place in the power-limit law (λ, s:
:mod:`aithermd.sim.law`), and its **memory-bound fraction** μ, the share of its unbound step time that
waits on memory rather than on the SM clock. NVML shows the SM clock; the work done is hidden. With μ the
two part the way they do on real GPUs: a step takes ``(1 − μ)/φ + μ`` of its unbound time when the SM
clock runs at φ of its unbound value (Amdahl's law over the clock), so

    r = 1 / ((1 − μ)/φ + μ)        φ = (1 − μ) / (1/r − μ)

and the cheap proxy "utilization × SM clock", which reads φ, overstates the slowdown of a memory-bound job.

Job kinds and where their numbers come from:

- **training**: (λ, s, own draw as a share of the card's highest limit) of one Zeus configuration the law
  was fitted on (:data:`aithermd.sim.law_fit.JOBS`, drawn uniformly). μ uniform in 0.2–0.6: Ivanov et al.,
  "Data Movement Is All You Need", MLSys 2021, measure BERT-large training on a V100 spending about 40 % of
  its time in memory-bound (normalization and element-wise) operators, with tensor contractions the rest.
- **decode** (LLM token generation): own draw 0.2–0.43 × the highest limit (Ma et al., "The Illusion of
  Power Capping in LLM Decode", arXiv:2605.11999, 2026: decode draws 137–300 W on a 700 W H200, so no cap
  at the stock limit binds); μ 0.990–0.999 and an SM-clock-scaled share of its draw (c) of 0.25–0.45, so
  that locking the SM clock at its floor saves 25–42 % of the energy at a 1–6 % slowdown (Maliakel et al.,
  "Characterizing LLM Inference Energy-Performance Tradeoffs", arXiv:2501.08219: 2842 → 180 MHz saves 42 %
  at +1–6 % latency; Ma et al.: clock locking recovers up to 32 % of decode energy). Its drawn power at an
  SM clock φ is ``u = 1 − c·(1 − g(φ))`` with g the dynamic power of CMOS logic, ``f·V²``, voltage
  falling linearly with the clock down to a floor (:func:`dynamic_power`).
- **held-high idle**: no work, but the card holds a context or a high P-state and draws 1.6–3 × its idle
  floor (the RTX 4090 trace idles at 34–38 W with 1.1–17 GB held, against 17.6 W at P8 with nothing held
  in the Windows 4090 trace and 20 W in the 8× RTX 4090 dump; the RTX 4060 Ti dump idles at P0, 30.5 W,
  0 %). A minimum SM clock lock removes the SM-clock part of that excess, taken as 40–70 % (no recording
  of a locked held-high idle exists in the project's data: a model choice, stated as such).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aithermd.sim import law, law_fit

TRAINING, DECODE, IDLE = "training", "decode", "idle"
MEM_FRAC_TRAINING = (0.2, 0.6)  # Ivanov et al. 2021 (see the module docstring)
DECODE_DRAW_RATIO = (137.0 / 700.0, 300.0 / 700.0)  # Ma et al. 2026, H200 decode
DECODE_MEM_FRAC = (0.990, 0.999)  # Maliakel et al. 2025: 16× lower SM clock, +1–6 % latency (0.996–0.999)
DECODE_SM_SHARE = (0.25, 0.45)  # clock floor saves 25–42 % of decode energy (Ma et al.; Maliakel et al.)
HELD_RATIO = (1.6, 3.0)  # held-high idle draw / idle floor (RTX 4090 traces and dumps, RTX 4060 Ti dump)
HELD_SM_SHARE = (0.4, 0.7)  # part of the held excess a minimum clock lock removes (model choice)
# CMOS dynamic power f·V²: voltage from V_FLOOR (relative) at PHI_V_FLOOR of the top clock up to 1 at the
# top (the usual shape of a GPU's voltage/frequency curve: flat at the floor voltage, then rising).
V_FLOOR, PHI_V_FLOOR = 0.7, 0.5
MIN_CLOCK_RATIO = 0.08  # the lowest SM clock a driver allows, over the highest (210 / 2520 MHz, RTX 4090)


@dataclass(frozen=True, slots=True)
class Job:
    """One job's hidden truth. ``draw_ratio``: own draw / the card's highest limit while busy;
    ``mem_frac`` μ; ``sm_share`` (decode) the part of its draw that scales with the SM clock;
    ``held_ratio`` (idle kinds): idle draw / idle floor, 1 for a card that drops to its floor;
    ``held_sm_share``: the part of the held excess a minimum clock lock removes; ``source`` what it was
    drawn from."""

    kind: str
    draw_ratio: float
    law: law.JobLaw = law.JobLaw()
    mem_frac: float = 0.4
    sm_share: float = 0.0
    held_ratio: float = 1.0
    held_sm_share: float = 0.0
    source: str = ""


@dataclass(frozen=True, slots=True)
class Operating:
    """Where a busy job runs this step: ``u`` drawn power / demand, ``r`` throughput / unbound,
    ``clock`` SM clock / unbound SM clock, ``capped`` whether the power limit is what holds it."""

    u: float
    r: float
    clock: float
    capped: bool


def training_job(rng: random.Random) -> Job:
    """A training job from the fitted Zeus configurations (uniform), μ from :data:`MEM_FRAC_TRAINING`."""
    key, lam, s, draw, _out = rng.choice(law_fit.JOBS)
    return Job(TRAINING, draw, law.JobLaw(lam, s, key), mem_frac=rng.uniform(*MEM_FRAC_TRAINING), source=key)


def decode_job(rng: random.Random) -> Job:
    """An LLM decode job (see the module docstring)."""
    return Job(DECODE, rng.uniform(*DECODE_DRAW_RATIO), mem_frac=rng.uniform(*DECODE_MEM_FRAC),
               sm_share=rng.uniform(*DECODE_SM_SHARE), source="decode")


def held_idle_job(rng: random.Random) -> Job:
    """An idle card held high by a process or a stuck P-state."""
    return Job(IDLE, 0.0, held_ratio=rng.uniform(*HELD_RATIO), held_sm_share=rng.uniform(*HELD_SM_SHARE),
               source="held-high idle")


def job_for(kind: str, seed: int, index: int) -> Job:
    """The ``index``-th job of ``kind`` for ``seed``: the same job whenever asked again."""
    rng = random.Random(f"{kind}/{seed}/{index}")
    return {TRAINING: training_job, DECODE: decode_job, IDLE: held_idle_job}[kind](rng)


def amdahl(mem_frac: float, clock: float) -> float:
    """r at SM clock ratio ``clock`` for a job with memory-bound fraction ``mem_frac``."""
    return 1.0 / ((1.0 - mem_frac) / max(clock, 1e-6) + mem_frac)


def clock_for(mem_frac: float, r: float) -> float:
    """The SM clock ratio at which the job runs at throughput ``r`` (inverse of :func:`amdahl`)."""
    if r >= 1.0:
        return 1.0
    return max(MIN_CLOCK_RATIO, (1.0 - mem_frac) / (1.0 / r - mem_frac))


def dynamic_power(clock: float) -> float:
    """g(φ): SM dynamic power at clock ratio φ relative to the top clock, f·V² with the voltage floor."""
    v = V_FLOOR + (1.0 - V_FLOOR) * min(1.0, max(0.0, (clock - PHI_V_FLOOR) / (1.0 - PHI_V_FLOOR)))
    return clock * v * v


def _decode_u(job: Job, clock: float) -> float:
    return 1.0 - job.sm_share * (1.0 - dynamic_power(clock))


def _decode_clock_for_u(job: Job, u: float) -> float:
    """The clock at which a decode job draws ``u`` (bisection on the monotone ``_decode_u``)."""
    if u >= 1.0:
        return 1.0
    lo, hi = MIN_CLOCK_RATIO, 1.0
    if _decode_u(job, lo) >= u:
        return lo
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _decode_u(job, mid) > u:
            hi = mid
        else:
            lo = mid
    return lo


def operate(job: Job, x: float, lock: float | None = None) -> Operating:
    """The operating point of a busy ``job`` under a cap at ``x`` × this step's demand and an SM clock
    lock at ``lock`` × the unbound clock (None: no lock). Whichever of the two is lower holds the clock.
    Never above the unbound point: u ≤ 1, r ≤ 1."""
    if job.kind == DECODE:
        cap_u = law.drawn_ratio(x, job.law.s)
        clock_cap = _decode_clock_for_u(job, cap_u)
        clock = min(clock_cap, lock) if lock is not None else clock_cap
        clock = max(MIN_CLOCK_RATIO, min(1.0, clock))
        return Operating(_decode_u(job, clock), amdahl(job.mem_frac, clock), clock,
                         capped=lock is None or clock_cap < lock)
    u, r = job.law.at_cap(x)
    clock = clock_for(job.mem_frac, r)
    if lock is not None and lock < clock:
        clock = max(MIN_CLOCK_RATIO, lock)
        r = amdahl(job.mem_frac, clock)
        return Operating(job.law.power_for(r), r, clock, capped=False)
    return Operating(u, r, clock, capped=u < 0.999)


def held_idle_w(job: Job, floor_w: float, lock: float | None) -> float:
    """Idle draw (W) of a card with idle floor ``floor_w``: held high by ``job``, less the SM part of the
    excess when the clock is locked at or near its minimum (``lock`` ≤ 0.2)."""
    excess = max(0.0, job.held_ratio - 1.0) * floor_w
    if lock is not None and lock <= 0.2:
        excess *= 1.0 - job.held_sm_share
    return floor_w + excess


def quantile_draw(rng: random.Random) -> float:
    """An own-draw ratio drawn from all the Zeus configurations (binding or not): for a job whose law is
    the population's (a trace without a power column)."""
    return rng.choice(law_fit.JOBS)[3]


__all__ = ["DECODE", "IDLE", "TRAINING", "Job", "Operating", "amdahl", "clock_for", "decode_job",
           "dynamic_power", "held_idle_job", "held_idle_w", "job_for", "operate", "training_job"]
