"""The fake NVML's process entry points: who holds each GPU, and how busy each process kept it.

Source of the facts: the NVML API reference (nvml.h) and what real drivers do:

- ``nvmlDeviceGetComputeRunningProcesses`` / ``nvmlDeviceGetGraphicsRunningProcesses`` (``_v2`` since the
  R450 drivers, ``_v3`` since R510; the plain name always): ``(device, *infoCount, infos)``. With ``infos``
  NULL or ``*infoCount`` too small they set ``*infoCount`` to the number of processes and return
  ``NVML_ERROR_INSUFFICIENT_SIZE`` (``NVML_SUCCESS`` with 0 when there are none); else they fill the
  array and set the count. The entries are the C structs of each version, written byte for byte:
  ``nvmlProcessInfo_v1_t`` (pid, usedGpuMemory; 16 bytes) for the plain name, ``nvmlProcessInfo_v2_t`` (+
  gpuInstanceId, computeInstanceId; 24 bytes) for ``_v2``/``_v3`` -- bindings whose struct differs from the
  driver's read garbage, as bindings did on real drivers. ``usedGpuMemory`` is
  ``NVML_VALUE_NOT_AVAILABLE`` (all ones) where the driver cannot tell (Windows WDDM); MIG instance ids
  are ``0xFFFFFFFF`` with MIG off.
- ``nvmlDeviceGetProcessUtilization(device, utilization, *processSamplesCount, lastSeenTimeStamp)``: the
  driver keeps a ring of samples (CPU timestamp in µs, pid, SM/memory/encoder/decoder %), one per process
  that had *non-zero* utilization in a sample period; the call returns those newer than
  ``lastSeenTimeStamp``. NULL ``utilization``: the count needed and ``INSUFFICIENT_SIZE``; no sample newer
  than the timestamp: ``NVML_ERROR_NOT_FOUND`` (an idle GPU, or a second read within one period);
  ``NOT_SUPPORTED`` in MIG mode.
"""

from __future__ import annotations

import ctypes
from typing import Any

from aithermd.sim.fake_nvml_lib import (
    INSUFFICIENT_SIZE,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    NvmlReturn,
    _out,
    _v,
)
from aithermd.sim.fake_nvml_state import FakeGpu, FakeProcess

NOT_AVAILABLE_U64 = 0xFFFF_FFFF_FFFF_FFFF  # NVML_VALUE_NOT_AVAILABLE as unsigned long long
NO_INSTANCE = 0xFFFF_FFFF  # gpuInstanceId/computeInstanceId with MIG off


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (nvml.h)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (nvml.h), also what ``_v3`` fills."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessUtilizationSample(ctypes.Structure):
    """nvmlProcessUtilizationSample_t (nvml.h)."""

    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


def _address(buffer: Any) -> int:
    """The address of the caller's array (ctypes array, pointer or int); 0 for NULL."""
    if buffer is None:
        return 0
    if isinstance(buffer, int):
        return buffer
    if isinstance(buffer, ctypes._Pointer):
        return ctypes.cast(buffer, ctypes.c_void_p).value or 0
    return ctypes.addressof(buffer)


def _write(address: int, structs: list[ctypes.Structure]) -> None:
    for i, st in enumerate(structs):
        size = ctypes.sizeof(st)
        ctypes.memmove(address + i * size, ctypes.addressof(st), size)


def _info(p: FakeProcess, struct: type[ctypes.Structure]) -> ctypes.Structure:
    memory = NOT_AVAILABLE_U64 if p.used_memory_bytes is None else p.used_memory_bytes
    if struct is ProcessInfoV1:
        return ProcessInfoV1(p.pid, memory)
    gi = NO_INSTANCE if p.gpu_instance_id is None else p.gpu_instance_id
    ci = NO_INSTANCE if p.compute_instance_id is None else p.compute_instance_id
    return ProcessInfoV2(p.pid, memory, gi, ci)


class NvmlProcessFunctions:
    """Mixin of :class:`~aithermd.sim.fake_nvml.FakeNvml` (``_dev(handle, name)`` comes from it)."""

    _dev: Any

    def _running(self, fname: str, handle: Any, count: Any, infos: Any, graphics: bool,
                 struct: type[ctypes.Structure]) -> int:
        gpu: FakeGpu = self._dev(handle, fname)
        procs = [p for p in gpu.processes.values() if (p.graphics if graphics else p.compute)]
        n_ref = _out(count)
        address = _address(infos)
        if not address or n_ref.value < len(procs):
            n_ref.value = len(procs)
            if not procs:
                return SUCCESS
            raise NvmlReturn(INSUFFICIENT_SIZE)
        _write(address, [_info(p, struct) for p in procs])
        n_ref.value = len(procs)
        return SUCCESS

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetComputeRunningProcesses", handle, count, infos, False,
                             ProcessInfoV1)

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v2", handle, count, infos, False,
                             ProcessInfoV2)

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v3", handle, count, infos, False,
                             ProcessInfoV2)

    def _nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses", handle, count, infos, True,
                             ProcessInfoV1)

    def _nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, count, infos, True,
                             ProcessInfoV2)

    def _nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, count, infos, True,
                             ProcessInfoV2)

    def _nvmlDeviceGetProcessUtilization(self, handle: Any, utilization: Any, count: Any,
                                         last_seen: Any) -> int:
        gpu: FakeGpu = self._dev(handle, "nvmlDeviceGetProcessUtilization")
        if gpu.mig:
            raise NvmlReturn(NOT_SUPPORTED)
        since = _v(last_seen)
        samples = [s for s in gpu.util_samples if s[0] > since]
        if not samples:
            raise NvmlReturn(NOT_FOUND)
        n_ref = _out(count)
        address = _address(utilization)
        if not address or n_ref.value < len(samples):
            n_ref.value = len(samples)
            raise NvmlReturn(INSUFFICIENT_SIZE)
        _write(address, [ProcessUtilizationSample(pid, ts, sm, mem, enc, dec)
                         for ts, pid, sm, mem, enc, dec in samples])
        n_ref.value = len(samples)
        return SUCCESS
