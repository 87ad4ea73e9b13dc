"""Who uses each GPU: process lists, per-process utilization and memory, read through NVML.

Called at the accounting cadence (seconds), never per tick, on the NVML worker thread
(:meth:`~aithermd.backends.nvml.NvmlBackend.usage`). Source of the facts: the NVML API reference (nvml.h):

- processes: ``nvmlDeviceGetComputeRunningProcesses_v3`` and ``nvmlDeviceGetGraphicsRunningProcesses_v3``
  (drivers ≥ R510), else the ``_v2`` entry points (≥ R450); a process in both lists is ``C+G``. Older
  drivers have only the v1 struct, which the bindings no longer read: no process list there (``error``).
  ``usedGpuMemory`` all ones (NVML_VALUE_NOT_AVAILABLE) → None; MIG ids 0xFFFFFFFF → None.
- utilization: ``nvmlDeviceGetProcessUtilization(handle, lastSeen)`` returns the driver's samples newer than
  ``lastSeen`` (µs, the driver's CPU clock). The next ``lastSeen`` is the newest timestamp it returned, so
  no sample is counted twice and none is skipped, whatever our own clock says. ``NOT_FOUND`` means no busy
  process since then (an empty mapping, not an error); ``NOT_SUPPORTED``/``FUNCTION_NOT_FOUND`` (MIG,
  pre-Maxwell) stops the reads for good (``utilization`` None). ``INSUFFICIENT_SIZE`` (samples arrived
  between the bindings' two calls) leaves ``lastSeen`` where it was: they are read next time.
  The first call of a reader asks from ``lastSeen`` 0: the driver's whole buffer, which holds the samples of
  processes that ran, and maybe died, while the daemon was down; the first pass's energy was split among them
  (attack9 N5: a dead job's pid took 1 369 of the next job's 3 000 J). So that call counts only the samples
  after the daemon started (``started_us``, its wall clock in µs): the driver's timestamps are CPU time in
  µs since the epoch (nvmlProcessUtilizationSample_t ``timeStamp``: "CPU Timestamp in microseconds"; real
  drivers return e.g. 1653167163586231), the wall clock's domain. Should they be ahead of the wall clock
  now (another clock), nothing is dropped; should they be behind it, that first call counts nothing. Either
  way ``lastSeen`` moves to the newest timestamp returned, in the driver's own domain, as on every call. A
  reader made again for a GPU found again goes on from the last one's ``lastSeen``.
- memory: ``nvmlDeviceGetMemoryInfo`` (bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aithermd.backends.nvml_probe import GpuProbe, Lost
from aithermd.model import GpuProcess, GpuUsage, ProcessUtilization

NOT_AVAILABLE_U64 = 0xFFFF_FFFF_FFFF_FFFF
NO_INSTANCE = 0xFFFF_FFFF
# µs: a driver timestamp up to this far ahead of the wall clock is still read as the wall clock's (a sample
# stamped while the daemon read the clock; NTP slews)
SAME_CLOCK_US = 60_000_000
_LISTS = (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses"))


class ProcessReader:
    """The process side of one GPU (``gpu`` probed by the backend). Keeps the entry-point version that
    works and the utilization timestamp between reads. ``started_us`` (wall clock, µs) and ``wall`` (the
    wall clock, s): the first read counts no sample from before the daemon started (module doc);
    ``last_seen_us``: the ``lastSeen`` of a previous reader of the same GPU (then ``started_us`` is moot)."""

    def __init__(self, gpu: GpuProbe, *, started_us: int | None = None,
                 wall: Callable[[], float] | None = None, last_seen_us: int = 0) -> None:
        self.gpu = gpu
        self.version: str | None = "_v3"  # None: no usable process list
        self.utilization_supported = True
        self.utilization_error: str | None = None
        self.last_seen_us = last_seen_us
        # µs: samples at or before it are the buffer's from before the daemon started (until the first read)
        self._started_us = started_us if not last_seen_us and wall is not None else None
        self._wall = wall

    def read(self) -> GpuUsage:
        """This GPU's usage now (raises :class:`~aithermd.backends.nvml_probe.Lost`)."""
        gpu, nv = self.gpu, self.gpu.nv
        processes, error = self._processes()
        utilization = self._utilization() if self.utilization_supported else None
        used = total = None
        try:
            info = gpu.call("nvmlDeviceGetMemoryInfo")
            used, total = int(info.used), int(info.total)
        except nv.NVMLError:
            pass
        return GpuUsage(gpu.id, gpu.uuid, processes, utilization, used, total, error,
                        None if self.utilization_supported else self.utilization_error)

    def _processes(self) -> tuple[tuple[GpuProcess, ...] | None, str | None]:
        nv = self.gpu.nv
        while self.version is not None:
            try:
                found: dict[int, tuple[str, Any]] = {}
                for kind, name in _LISTS:
                    for p in self.gpu.call(name + self.version):
                        kinds, first = found.get(p.pid, ("", p))
                        found[p.pid] = (kinds + ("+" if kinds else "") + kind, first)
                return tuple(_process(pid, kinds, p) for pid, (kinds, p) in found.items()), None
            except Lost:
                raise
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.version = "_v2" if self.version == "_v3" else None
                    continue
                return None, self.gpu.names.get(exc.value, f"NVML_ERROR_{exc.value}")
        return None, "NVML_ERROR_FUNCTION_NOT_FOUND: the driver predates the v2 process lists (R450)"

    def _utilization(self) -> dict[int, ProcessUtilization] | None:
        nv = self.gpu.nv
        try:
            samples = self.gpu.call("nvmlDeviceGetProcessUtilization", self.last_seen_us)
        except Lost:
            raise
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_NOT_FOUND:
                return {}
            if exc.value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self.utilization_supported = False
                self.utilization_error = self.gpu.names.get(exc.value, f"NVML_ERROR_{exc.value}")
                return None
            return {}  # INSUFFICIENT_SIZE (a race), UNKNOWN: nothing this time, lastSeen kept
        sums: dict[int, list[float]] = {}
        newest = counted = self.last_seen_us
        started, self._started_us = self._started_us, None
        if started is not None and self._wall is not None and samples and \
                max(int(s.timeStamp) for s in samples) <= self._wall() * 1e6 + SAME_CLOCK_US:
            counted = max(counted, started)  # the buffer's samples from before the start count nothing
        for s in samples:
            if s.timeStamp <= self.last_seen_us:
                continue  # never count a sample twice
            newest = max(newest, int(s.timeStamp))
            if s.timeStamp <= counted:
                continue
            sm, mem, enc, dec = (min(100, int(v)) for v in (s.smUtil, s.memUtil, s.encUtil, s.decUtil))
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0, 0.0, 0])
            acc[0] += sm
            acc[1] += mem
            acc[2] += enc
            acc[3] += dec
            acc[4] += 1
        self.last_seen_us = newest
        return {pid: ProcessUtilization(sm / n, mem / n, enc / n, dec / n, sm + enc + dec, int(n))
                for pid, (sm, mem, enc, dec, n) in sums.items()}


def _process(pid: int, kinds: str, p: Any) -> GpuProcess:
    memory = p.usedGpuMemory
    gi, ci = getattr(p, "gpuInstanceId", NO_INSTANCE), getattr(p, "computeInstanceId", NO_INSTANCE)
    return GpuProcess(int(pid), kinds,
                      None if memory is None or memory == NOT_AVAILABLE_U64 else int(memory),
                      None if gi == NO_INSTANCE else int(gi), None if ci == NO_INSTANCE else int(ci))
