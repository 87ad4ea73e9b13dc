"""The fake NVML's entry points for locked clocks, supported clocks and GPM metrics (NVML API reference,
nvml.h). Same conventions as :mod:`aithermd.sim.fake_nvml_lib`; clocks in MHz.

What the real library does, and so the fake:

- ``nvmlDeviceSetGpuLockedClocks(dev, minMHz, maxMHz)``: Volta and newer (``NOT_SUPPORTED`` before, and
  here for a dump that does not name its architecture); root only (``NO_PERMISSION``); ``min > max`` is
  ``INVALID_ARGUMENT``; values beyond the supported range are accepted and the clocks held to the nearest
  supported ones; ``NVML_CLOCK_LIMIT_ID_TDP`` / ``_UNLIMITED`` (0xffffff01/02) as the max mean "up to the
  base/boost limit". There is no getter: what is locked is only seen in the clocks that result.
  ``nvmlDeviceResetGpuLockedClocks`` undoes it (same errors).
- ``nvmlDeviceGetSupportedGraphicsClocks(dev, memMHz, *count, clocks)``: the two-call size protocol
  (``INSUFFICIENT_SIZE`` with the count, then the list, highest first), ``NOT_FOUND`` for a memory clock
  the card does not have.
- GPM (Hopper and newer): ``nvmlGpmQueryDeviceSupport`` says whether the device has it;
  ``nvmlGpmSampleAlloc``/``Free`` hand out opaque samples; ``nvmlGpmSampleGet`` fills one with the
  device's counters (``NOT_SUPPORTED`` off Hopper); ``nvmlGpmMetricsGet`` turns two samples of one device
  into rates over the interval between them (per-metric ``nvmlReturn``; ``INVALID_ARGUMENT`` for a
  version other than 1 or samples of two devices).
"""

from __future__ import annotations

import ctypes
from typing import Any

from aithermd.sim.fake_nvml_lib import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    NvmlReturn,
    _need,
    _out,
    _v,
)
from aithermd.sim.fake_nvml_state import FakeGpu

LOCKED_CLOCKS_ARCHITECTURES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
GPM_ARCHITECTURES = ("hopper", "blackwell")
CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED = 0xFFFFFF01, 0xFFFFFF02  # NVML_CLOCK_LIMIT_ID_*
MIN_GRAPHICS_CLOCK_MHZ = 210  # the lowest graphics clock NVML lists on Turing and newer boards
CLOCK_STEP_MHZ = 15  # graphics clocks are listed in 15 MHz steps
GPM_SAMPLE_BASE = 0x47500000
GPM_METRICS_GET_VERSION = 1
GPM_GRAPHICS_UTIL, GPM_SM_UTIL, GPM_ANY_TENSOR_UTIL = 1, 2, 5  # NVML_GPM_METRIC_*


def _arch(gpu: FakeGpu) -> str:
    return (gpu.profile.architecture or "").lower()


def supported_clocks(gpu: FakeGpu) -> list[int]:
    """Graphics clocks (MHz) the card lists, highest first: its max SM clock down to the floor."""
    top = int(_need(gpu.profile.max_sm_clock_mhz))
    return list(range(top, MIN_GRAPHICS_CLOCK_MHZ - 1, -CLOCK_STEP_MHZ))


def effective_lock(gpu: FakeGpu) -> tuple[int, int] | None:
    """The locked range after clamping to the supported clocks, or None when not locked."""
    if gpu.locked_clocks is None:
        return None
    lo, hi = gpu.locked_clocks
    top = int(gpu.profile.max_sm_clock_mhz or 0) or hi
    if hi in (CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED):
        hi = top
    hi = max(MIN_GRAPHICS_CLOCK_MHZ, min(top, hi))
    lo = max(MIN_GRAPHICS_CLOCK_MHZ, min(hi, lo))
    return lo, hi


class NvmlClockFunctions:
    """Mixin of :class:`~aithermd.sim.fake_nvml.FakeNvml` (see
    :class:`~aithermd.sim.fake_nvml_lib.NvmlFunctions`)."""

    gpus: list[FakeGpu]

    # ---- locked clocks ----
    def _lockable(self, handle: Any, name: str) -> FakeGpu:
        gpu = self._dev(handle, name)  # type: ignore[attr-defined]
        if not _arch(gpu).startswith(LOCKED_CLOCKS_ARCHITECTURES) or not gpu.profile.max_sm_clock_mhz:
            raise NvmlReturn(NOT_SUPPORTED)
        self._write_allowed()  # type: ignore[attr-defined]
        return gpu

    def _nvmlDeviceSetGpuLockedClocks(self, handle: Any, lo: Any, hi: Any) -> int:
        gpu = self._lockable(handle, "nvmlDeviceSetGpuLockedClocks")
        lo_mhz, hi_mhz = _v(lo), _v(hi)
        if hi_mhz not in (CLOCK_LIMIT_TDP, CLOCK_LIMIT_UNLIMITED) and lo_mhz > hi_mhz:
            raise NvmlReturn(INVALID_ARGUMENT)
        gpu.locked_clocks = (lo_mhz, hi_mhz)
        self._persist()  # type: ignore[attr-defined]
        return SUCCESS

    def _nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> int:
        gpu = self._lockable(handle, "nvmlDeviceResetGpuLockedClocks")
        gpu.locked_clocks = None
        self._persist()  # type: ignore[attr-defined]
        return SUCCESS

    def _nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, mem: Any, count: Any, clocks: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetSupportedGraphicsClocks")  # type: ignore[attr-defined]
        mem_clocks = {int(c) for c in (gpu.profile.max_memory_clock_mhz, gpu.memory_clock_mhz) if c}
        if _v(mem) not in mem_clocks:
            raise NvmlReturn(NOT_FOUND)
        values = supported_clocks(gpu)
        n = _out(count)
        if clocks is None or n.value < len(values):
            n.value = len(values)
            raise NvmlReturn(INSUFFICIENT_SIZE)
        for i, c in enumerate(values):
            clocks[i] = c
        n.value = len(values)
        return SUCCESS

    # ---- GPM ----
    def _gpm_device(self, handle: Any, name: str) -> FakeGpu:
        return self._dev(handle, name)  # type: ignore[attr-defined, no-any-return]

    def _nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> int:
        gpu = self._gpm_device(handle, "nvmlGpmQueryDeviceSupport")
        st = _out(ref)
        if st.version != 1:
            raise NvmlReturn(INVALID_ARGUMENT)
        st.isSupportedDevice = int(_arch(gpu).startswith(GPM_ARCHITECTURES))
        return SUCCESS

    def _nvmlGpmSampleAlloc(self, ref: Any) -> int:
        self._ensure_init()  # type: ignore[attr-defined]
        samples: dict[int, Any] = self.__dict__.setdefault("_gpm_samples", {})
        addr = GPM_SAMPLE_BASE + self.__dict__.setdefault("_gpm_next", 0)
        self.__dict__["_gpm_next"] += 1
        samples[addr] = None
        ctypes.c_void_p.from_buffer(_out(ref)).value = addr
        return SUCCESS

    def _sample_addr(self, sample: Any) -> int:
        addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        if addr not in self.__dict__.get("_gpm_samples", {}):
            raise NvmlReturn(INVALID_ARGUMENT)
        return addr

    def _nvmlGpmSampleFree(self, sample: Any) -> int:
        self._ensure_init()  # type: ignore[attr-defined]
        del self.__dict__["_gpm_samples"][self._sample_addr(sample)]
        return SUCCESS

    def _nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        gpu = self._gpm_device(handle, "nvmlGpmSampleGet")
        if not _arch(gpu).startswith(GPM_ARCHITECTURES):
            raise NvmlReturn(NOT_SUPPORTED)
        self.__dict__["_gpm_samples"][self._sample_addr(sample)] = (
            self.gpus.index(gpu), gpu.gpm_elapsed_s, gpu.gpm_busy_s, gpu.gpm_tensor_s)
        return SUCCESS

    def _nvmlGpmMetricsGet(self, ref: Any) -> int:
        self._ensure_init()  # type: ignore[attr-defined]
        mg = _out(ref)
        if mg.version != GPM_METRICS_GET_VERSION:
            raise NvmlReturn(INVALID_ARGUMENT)
        samples = self.__dict__.get("_gpm_samples", {})
        first, second = samples.get(self._sample_addr(mg.sample1)), samples.get(self._sample_addr(mg.sample2))
        if first is None or second is None or first[0] != second[0]:
            raise NvmlReturn(INVALID_ARGUMENT)
        span = second[1] - first[1]
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if span <= 0:
                m.nvmlReturn, m.value = INVALID_ARGUMENT, 0.0
                continue
            rates = {GPM_GRAPHICS_UTIL: second[2] - first[2], GPM_SM_UTIL: second[2] - first[2],
                     GPM_ANY_TENSOR_UTIL: second[3] - first[3]}
            if m.metricId not in rates:
                m.nvmlReturn, m.value = NOT_SUPPORTED, 0.0
                continue
            m.nvmlReturn, m.value = SUCCESS, min(100.0, max(0.0, 100.0 * rates[m.metricId] / span))
        return SUCCESS
