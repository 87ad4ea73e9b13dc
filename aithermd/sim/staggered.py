"""Phase-shifted jobs: each GPU runs the same workload, its own clock shifted (``--stagger S``: GPU *i* starts
its cycle *i* × S seconds later). With the default 2/6/2-minute cycle and S = 150 s on four GPUs, jobs
arrive and end one after another and every number of busy GPUs from one to four occurs — what a shared
box with several users looks like, and what a node power budget has to follow.

Before its start a GPU idles (the cycle's idle phase). The CPU feeds the GPUs: its utilization is the mean
of the workload's CPU utilization at each GPU's own time. The phase is the busy kind while any GPU is busy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aithermd.sim.jobs import IDLE
from aithermd.sim.workload import GpuLoad, Workload


@dataclass(frozen=True)
class StaggeredWorkload:
    """``inner`` with GPU *i* shifted by ``offsets_s[i]`` s (the last offset for GPUs beyond the list)."""

    inner: Workload
    offsets_s: Sequence[float]

    def __post_init__(self) -> None:
        if not self.offsets_s or any(o < 0 for o in self.offsets_s):
            raise ValueError("offsets must be one or more numbers of seconds >= 0")

    @classmethod
    def every(cls, inner: Workload, stagger_s: float, gpus: int) -> StaggeredWorkload:
        """GPU *i* starts ``i`` × ``stagger_s`` s after GPU 0."""
        return cls(inner, tuple(i * stagger_s for i in range(max(1, gpus))))

    @property
    def duration_s(self) -> float:
        return self.inner.duration_s

    def _t(self, gpu: int, t_s: float) -> float:
        return t_s - self.offsets_s[min(gpu, len(self.offsets_s) - 1)]

    def gpu_util_pct(self, gpu: int, t_s: float) -> float:
        return self.inner.gpu_util_pct(gpu, self._t(gpu, t_s))

    def gpu_load(self, gpu: int, t_s: float) -> GpuLoad:
        return self.inner.gpu_load(gpu, self._t(gpu, t_s))

    def cpu_util_pct(self, t_s: float) -> float:
        n = len(self.offsets_s)
        return sum(self.inner.cpu_util_pct(self._t(i, t_s)) for i in range(n)) / n

    def phase(self, t_s: float) -> str:
        phases = [self.inner.phase(self._t(i, t_s)) for i in range(len(self.offsets_s))]
        return next((p for p in phases if p != IDLE), IDLE)
