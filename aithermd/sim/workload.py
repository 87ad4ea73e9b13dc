"""What the simulated machine is asked to do: GPU and CPU utilization over simulated time. Pure and
deterministic: the same seed and time give the same load, whatever the step length.

Two workloads:

- :class:`CycleWorkload` (the default): idle → training → idle, 2, 6 and 2 simulated minutes, repeating.
  Training holds the GPUs at 92–100 % with short data-loader dips (to 30–60 % for a second or two, about
  one second in 25), as real training traces show; idle is 0–3 %. The CPU feeds the GPUs (35–45 % while
  training) and idles at 2–5 %.
- :class:`TraceWorkload`: the ``utilization.gpu`` column of a real ``nvidia-smi --query-gpu ...
  --format=csv`` log (``--trace FILE``), parsed by :mod:`aithermd.policy.trace`; trace GPU *i* drives
  simulated GPU *i* (the last trace GPU drives any extra ones). Time runs from the first sample; between
  samples the last value holds; after the trace ends the GPUs idle.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

IDLE = "idle"
TRAINING = "training"


class Workload(Protocol):
    """Load as a function of simulated time ``t_s`` (seconds since the simulation began)."""

    duration_s: float  # one pass of the workload (a full cycle, or the trace's length)

    def gpu_util_pct(self, gpu: int, t_s: float) -> float: ...

    def cpu_util_pct(self, t_s: float) -> float: ...

    def phase(self, t_s: float) -> str: ...


def _noise(seed: int, channel: int, t_s: float) -> random.Random:
    """A generator fixed by (seed, channel, whole second): the same draw for every step inside one second."""
    return random.Random(seed * 1_000_003 + channel * 7_919 + int(t_s // 1))


@dataclass(frozen=True, slots=True)
class CycleWorkload:
    """Idle for ``idle_before_s``, training for ``training_s``, idle for ``idle_after_s``, repeating."""

    idle_before_s: float = 120.0
    training_s: float = 360.0
    idle_after_s: float = 120.0
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.idle_before_s, self.training_s, self.idle_after_s) < 0 or self.duration_s <= 0:
            raise ValueError("phase lengths must be >= 0 and add up to more than 0")

    @property
    def duration_s(self) -> float:
        return self.idle_before_s + self.training_s + self.idle_after_s

    def phase(self, t_s: float) -> str:
        """``"training"`` inside the training phase of the current cycle, else ``"idle"``."""
        t = max(0.0, t_s) % self.duration_s
        return TRAINING if self.idle_before_s <= t < self.idle_before_s + self.training_s else IDLE

    def gpu_util_pct(self, gpu: int, t_s: float) -> float:
        rng = _noise(self.seed, 1 + gpu, t_s)
        if self.phase(t_s) == IDLE:
            return float(rng.choice((0, 0, 0, 0, 0, 1, 2, 3)))
        if rng.random() < 0.04:
            return float(rng.randint(30, 60))  # the data loader stalls the step
        return float(rng.randint(92, 100))

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

    def _row(self, t_s: float) -> tuple[float, ...] | None:
        t = t_s + self.times_s[0]
        if t_s < 0 or t_s >= self.duration_s:
            return None
        return self.utils_pct[max(0, bisect.bisect_right(self.times_s, t) - 1)]

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
    def from_rows(cls, rows: Sequence[tuple[float, Sequence[float | None]]], *,
                  source: str = "") -> TraceWorkload:
        """From ``(t_s, [util % per GPU])`` rows (times from any origin); a missing value (None) repeats the
        GPU's previous one (0 at the start)."""
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
        return cls(times_s=tuple(t - t0 for t in times), utils_pct=tuple(utils), source=source)


def load_trace(path: str | Path) -> TraceWorkload:
    """A :class:`TraceWorkload` from an ``nvidia-smi --query-gpu=... --format=csv`` log.

    Parsing is :func:`aithermd.policy.trace.parse_trace`'s (every real variant: units or not, any column
    order, with or without an index column, many GPUs). Raises its ``TraceError`` (file:line and what is
    wrong) for a malformed trace, and one naming the file when the trace has no ``utilization.gpu`` column;
    ``OSError`` when the file cannot be read.
    """
    from aithermd.policy.trace import TraceError, parse_trace, read_trace_text

    text = read_trace_text(path, errors="replace")
    trace = parse_trace(text, str(path))
    if "utilization.gpu" not in trace.fields:
        raise TraceError(1, "no utilization.gpu column: the simulator replays GPU utilization "
                            "(nvidia-smi --query-gpu=timestamp,utilization.gpu,... --format=csv)", str(path))
    rows = [(sample.t, [None if row is None else row.values.get("utilization.gpu") for row in sample.gpus])
            for sample in trace.samples]
    if not rows:
        raise TraceError(1, "the trace has no samples", str(path))
    return TraceWorkload.from_rows(rows, source=str(path))
