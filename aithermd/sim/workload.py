"""What the simulated machine is asked to do: per GPU its utilization, its demand and the job behind it,
and the CPU's utilization, over simulated time. Pure and deterministic: the same seed and time give the
same load, whatever the step length.

Two workloads:

- :class:`CycleWorkload` (the default): idle → busy → idle, 2, 6 and 2 simulated minutes, repeating. The
  busy phase runs one job per GPU and cycle (:mod:`aithermd.sim.jobs`: training by default, drawn from the
  Zeus configurations; ``busy_kind`` decode for LLM token generation). Training holds the GPUs at 92–100 %
  with short data-loader dips (to 30–60 % for a second or two, about one second in 25), as real training
  traces show; decode at 85–100 %; idle is 0–3 %, and with ``held_idle`` the idle cards are held high
  (a context or a stuck P-state). The job's demand fluctuates around its own draw second by second as the
  real traces' busy samples do: their 1 s power.draw stays within 0.92–1.06 × its median 80 % of the time
  (RTX 4090 trace; 0.88–1.13 in the Windows trace, whose phases last minutes), and the highest second of a
  minute is 1.10 × that minute's mean in both — white noise of σ 4 % plus a slow swing of ±5 % does that.
  The slow swing moves the demand the power-limit law sees; the white noise only what the power reads
  (the law, fitted on epoch averages, already holds the seconds' bursts). A trace's own draw is treated
  alike: smoothed over 10 s for the law, its seconds' deviation from that shown on top.
  The CPU feeds the GPUs (35–45 % while busy) and idles at 2–5 %.
- :class:`TraceWorkload`: the ``utilization.gpu`` column of a real ``nvidia-smi --query-gpu ...
  --format=csv`` log (``--trace FILE``), parsed by :mod:`aithermd.policy.trace`, and its ``power.draw``
  as the demand when the trace has one (the trace's own draw: a card is never given more than it drew);
  trace GPU *i* drives simulated GPU *i* (the last trace GPU drives any extra ones). Time runs from the
  first sample; between samples the last value holds; after the trace ends the GPUs idle.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aithermd.sim.jobs import DECODE, IDLE, MEM_FRAC_TRAINING, TRAINING, Job, job_for
from aithermd.sim.law import JobLaw

NOISE_SIGMA = 0.04  # per-second demand noise (see the module docstring)
SMOOTH_S = 10.0  # a trace's power.draw is smoothed over this long for the power-limit law
# a trace's job: the population law (λ = 1, the median s), 0.7 of the default limit (the Zeus own-draw
# median 0.69) and the middle of the training μ range
TRACE_JOB = Job(TRAINING, 0.7, JobLaw(), mem_frac=sum(MEM_FRAC_TRAINING) / 2.0, source="population")
SWING = 0.05  # slow swing of the demand, ± share of the own draw (the recorded traces: CALIBRATION.md § 2)
SWING_PERIOD_S = (90.0, 300.0)  # its period, drawn per job: a model choice (the traces' slow drift)


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """One GPU at one instant: ``util_pct`` (what NVML will show), the ``job`` (None: idle at its floor),
    ``draw_w`` the job's own demand when the workload knows it in watts (a trace's power.draw, smoothed
    over :data:`SMOOTH_S`), else None and ``scale`` × the job's own draw (its slow swing); ``jitter`` the
    second's own deviation from that, which the drawn power shows but the power-limit law already
    contains (the Zeus epochs average over their seconds)."""

    util_pct: float
    job: Job | None = None
    draw_w: float | None = None
    scale: float = 1.0
    jitter: float = 1.0


class Workload(Protocol):
    """Load as a function of simulated time ``t_s`` (seconds since the simulation began)."""

    duration_s: float  # one pass of the workload (a full cycle, or the trace's length)

    def gpu_util_pct(self, gpu: int, t_s: float) -> float: ...

    def gpu_load(self, gpu: int, t_s: float) -> GpuLoad: ...

    def cpu_util_pct(self, t_s: float) -> float: ...

    def phase(self, t_s: float) -> str: ...


def _noise(seed: int, channel: int, t_s: float) -> random.Random:
    """A generator fixed by (seed, channel, whole second): the same draw for every step inside one second."""
    return random.Random(seed * 1_000_003 + channel * 7_919 + int(t_s // 1))


def demand_scale(seed: int, gpu: int, t_s: float) -> tuple[float, float]:
    """The job's demand as a share of its own draw: its slow swing (1 ± :data:`SWING`), and the second's
    white noise as a factor on top (mean 1)."""
    rng = _noise(seed, 101 + gpu, t_s)
    slow = random.Random(seed * 7_919 + gpu)
    period = slow.uniform(*SWING_PERIOD_S)
    swing = SWING * math.sin(2.0 * math.pi * int(t_s) / period + slow.uniform(0.0, 2.0 * math.pi))
    return 1.0 + swing, max(0.5, 1.0 + rng.gauss(0.0, NOISE_SIGMA))


@dataclass(frozen=True, slots=True)
class CycleWorkload:
    """Idle for ``idle_before_s``, busy for ``training_s``, idle for ``idle_after_s``, repeating.
    ``busy_kind``: the busy phase's jobs (``training`` or ``decode``); ``held_idle``: idle cards are held
    high (:func:`aithermd.sim.jobs.held_idle_job`)."""

    idle_before_s: float = 120.0
    training_s: float = 360.0
    idle_after_s: float = 120.0
    seed: int = 0
    busy_kind: str = TRAINING
    held_idle: bool = False

    def __post_init__(self) -> None:
        if min(self.idle_before_s, self.training_s, self.idle_after_s) < 0 or self.duration_s <= 0:
            raise ValueError("phase lengths must be >= 0 and add up to more than 0")
        if self.busy_kind not in (TRAINING, DECODE):
            raise ValueError(f"busy_kind must be {TRAINING} or {DECODE}, not {self.busy_kind!r}")

    @property
    def duration_s(self) -> float:
        return self.idle_before_s + self.training_s + self.idle_after_s

    def phase(self, t_s: float) -> str:
        """The busy kind (``"training"``, ``"decode"``) inside the busy phase of the current cycle, else
        ``"idle"``."""
        t = max(0.0, t_s) % self.duration_s
        return self.busy_kind if self.idle_before_s <= t < self.idle_before_s + self.training_s else IDLE

    def gpu_util_pct(self, gpu: int, t_s: float) -> float:
        rng = _noise(self.seed, 1 + gpu, t_s)
        if self.phase(t_s) == IDLE:
            return float(rng.choice((0, 0, 0, 0, 0, 1, 2, 3)))
        if self.busy_kind == DECODE:
            return float(rng.randint(85, 100))
        if rng.random() < 0.04:
            return float(rng.randint(30, 60))  # the data loader stalls the step
        return float(rng.randint(92, 100))

    def job(self, gpu: int, t_s: float) -> Job | None:
        """The job on ``gpu`` at ``t_s``: one per GPU and cycle in the busy phase; in the idle phases a
        held-high idle (with ``held_idle``) or None."""
        cycle = int(max(0.0, t_s) // self.duration_s)
        if self.phase(t_s) == IDLE:
            return job_for(IDLE, self.seed, cycle * 64 + gpu) if self.held_idle else None
        return job_for(self.busy_kind, self.seed, cycle * 64 + gpu)

    def gpu_load(self, gpu: int, t_s: float) -> GpuLoad:
        job = self.job(gpu, t_s)
        busy = job is not None and job.kind != IDLE
        scale, jitter = demand_scale(self.seed, gpu, t_s) if busy else (1.0, 1.0)
        return GpuLoad(self.gpu_util_pct(gpu, t_s), job, scale=scale, jitter=jitter)

    def cpu_util_pct(self, t_s: float) -> float:
        rng = _noise(self.seed, 0, t_s)
        if self.phase(t_s) == IDLE:
            return 2.0 + 3.0 * rng.random()
        return 35.0 + 10.0 * rng.random()


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """Utilization replayed from samples: ``times_s`` ascending from 0, ``utils_pct[k]`` the per-GPU
    utilization (%) at ``times_s[k]``. ``busy_pct``: the utilization at and above which a sample counts as
    training for :meth:`phase`. ``source`` names the trace for messages."""

    times_s: tuple[float, ...]
    utils_pct: tuple[tuple[float, ...], ...]
    busy_pct: float = 30.0
    source: str = ""
    powers_w: tuple[tuple[float | None, ...], ...] | None = None  # per sample, per GPU power.draw (W)
    seed: int = 0
    gaps: tuple[dict[str, float], ...] = ()  # where the log stopped (aithermd.policy.trace.gaps)

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.utils_pct):
            raise ValueError(f"{self.source or 'trace'}: needs one utilization row per sample, and a sample")
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError(f"{self.source or 'trace'}: sample times go backwards")
        if any(not row for row in self.utils_pct):
            raise ValueError(f"{self.source or 'trace'}: a sample without any GPU")

    @property
    def duration_s(self) -> float:
        return self.times_s[-1] - self.times_s[0] + (self.times_s[1] - self.times_s[0]
                                                     if len(self.times_s) > 1 else 1.0)

    def _index(self, t_s: float) -> int | None:
        if t_s < 0 or t_s >= self.duration_s:
            return None
        return max(0, bisect.bisect_right(self.times_s, t_s + self.times_s[0]) - 1)

    def _row(self, t_s: float) -> tuple[float, ...] | None:
        k = self._index(t_s)
        return None if k is None else self.utils_pct[k]

    def gpu_load(self, gpu: int, t_s: float) -> GpuLoad:
        """Utilization, and the trace's own power.draw as the demand when it has one. A GPU with work
        (utilization > 0) runs :data:`TRACE_JOB`, the population's median job (the trace does not say how
        its job answers a cap); at 0 % it idles, held at whatever the trace drew."""
        k = self._index(t_s)
        util = 0.0 if k is None else float(self.utils_pct[k][min(gpu, len(self.utils_pct[k]) - 1)])
        draw, jitter = None, 1.0
        if k is not None and self.powers_w is not None:
            col = min(gpu, len(self.powers_w[k]) - 1)
            raw = self.powers_w[k][col]
            if raw is not None:
                draw = self._smooth(k, col)
                jitter = raw / draw if draw and draw > 0 else 1.0
        job = TRACE_JOB if util > 0 else job_for(IDLE, self.seed, gpu)
        return GpuLoad(util, job, draw_w=draw, jitter=jitter)

    def _smooth(self, k: int, col: int) -> float | None:
        """The trace's power.draw of GPU column ``col`` averaged over the samples within ±SMOOTH_S/2 of
        sample ``k`` (known values only)."""
        assert self.powers_w is not None
        t, half = self.times_s[k], SMOOTH_S / 2.0
        lo = bisect.bisect_left(self.times_s, t - half)
        hi = bisect.bisect_right(self.times_s, t + half)
        values = [v for row in self.powers_w[lo:hi] if (v := row[min(col, len(row) - 1)]) is not None]
        return sum(values) / len(values) if values else None

    def gpu_util_pct(self, gpu: int, t_s: float) -> float:
        row = self._row(t_s)
        if row is None:
            return 0.0
        return float(row[min(gpu, len(row) - 1)])

    def cpu_util_pct(self, t_s: float) -> float:
        """The CPU follows the GPUs: 3 % at idle up to 40 % at full GPU load (a data-loader model)."""
        row = self._row(t_s)
        mean = sum(row) / len(row) if row else 0.0
        return 3.0 + 0.37 * mean

    def phase(self, t_s: float) -> str:
        row = self._row(t_s)
        return TRAINING if row is not None and max(row) >= self.busy_pct else IDLE

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[float, Sequence[float | None]]], *, source: str = "",
                  powers: Sequence[Sequence[float | None]] | None = None, seed: int = 0) -> TraceWorkload:
        """From ``(t_s, [util % per GPU])`` rows (times from any origin); a missing value (None) repeats the
        GPU's previous one (0 at the start). ``powers``: per row, per GPU power.draw in W (None where
        unknown: the previous value holds; the whole GPU unknown: its demand comes from its job)."""
        times: list[float] = []
        utils: list[tuple[float, ...]] = []
        last: list[float] = []
        for t, row in rows:
            values = [(last[i] if i < len(last) else 0.0) if v is None else float(v)
                      for i, v in enumerate(row)]
            last = values
            times.append(float(t))
            utils.append(tuple(values))
        t0 = times[0] if times else 0.0
        power_rows = None
        if powers is not None:
            held: list[float | None] = []
            power_rows = []
            for row in powers:
                values_p = [(held[i] if i < len(held) else None) if v is None else float(v)
                            for i, v in enumerate(row)]
                held = values_p
                power_rows.append(tuple(values_p))
            power_rows = tuple(power_rows)
        return cls(times_s=tuple(t - t0 for t in times), utils_pct=tuple(utils), source=source,
                   powers_w=power_rows, seed=seed)


def load_trace(path: str | Path, seed: int = 0) -> TraceWorkload:
    """A :class:`TraceWorkload` from an ``nvidia-smi --query-gpu=... --format=csv`` log.

    Parsing is :func:`aithermd.policy.trace.parse_trace`'s (every real variant: units or not, any column
    order, with or without an index column, many GPUs). Raises its ``TraceError`` (file:line and what is
    wrong) for a malformed trace, and one naming the file when the trace has no ``utilization.gpu`` column;
    ``OSError`` when the file cannot be read.
    """
    from aithermd.policy.trace import TraceError, gaps, parse_trace, read_trace_text

    text = read_trace_text(path, errors="replace")
    trace = parse_trace(text, str(path))
    if "utilization.gpu" not in trace.fields:
        raise TraceError(1, "no utilization.gpu column: the simulator replays GPU utilization "
                            "(nvidia-smi --query-gpu=timestamp,utilization.gpu,... --format=csv)", str(path))
    rows = [(sample.t, [None if row is None else row.values.get("utilization.gpu") for row in sample.gpus])
            for sample in trace.samples]
    if not rows:
        raise TraceError(1, "the trace has no samples", str(path))
    powers = None
    if "power.draw" in trace.fields:
        powers = [[None if row is None else row.values.get("power.draw") for row in sample.gpus]
                  for sample in trace.samples]
    load = TraceWorkload.from_rows(rows, source=str(path), powers=powers, seed=seed)
    return dataclasses.replace(load, gaps=tuple(gaps(trace)))
