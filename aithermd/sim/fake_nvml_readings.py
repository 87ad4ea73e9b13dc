"""The fake NVML's C entry points for readings: utilization, clocks, performance state, fans, batched
fields (NVML API reference, nvml.h; units %, MHz, mW, mJ, °C). Same conventions as
:mod:`aithermd.sim.fake_nvml_lib`."""

from __future__ import annotations

import time
from typing import Any

from aithermd.sim.fake_nvml_lib import (
    FAN_POLICY_AUTO,
    FAN_POLICY_MANUAL,
    FI_ENERGY,
    FI_MEMORY_TEMP,
    FI_POWER_AVERAGE,
    FI_POWER_CURRENT_LIMIT,
    FI_POWER_DEFAULT,
    FI_POWER_INSTANT,
    FI_POWER_MAX,
    FI_POWER_MIN,
    FI_POWER_REQUESTED_LIMIT,
    FI_TOTAL_ENERGY,
    FIELD_SINCE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    VT_UINT,
    VT_ULL,
    NvmlReturn,
    _need,
    _out,
    _v,
)
from aithermd.sim.fake_nvml_state import FakeGpu


class NvmlReadingFunctions:
    """Mixin of :class:`~aithermd.sim.fake_nvml.FakeNvml` (see
    :class:`~aithermd.sim.fake_nvml_lib.NvmlFunctions`)."""

    # ---- utilization, clocks, state ----
    def _nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        u = _out(ref)
        u.gpu, u.memory = _need(gpu.gpu_util_pct), _need(gpu.memory_util_pct)
        return SUCCESS

    def _clock(self, gpu: FakeGpu, kind: int, maximum: bool) -> int:
        p = gpu.profile
        table = (
            {0: p.max_sm_clock_mhz, 1: p.max_sm_clock_mhz, 2: p.max_memory_clock_mhz}
            if maximum
            else {0: gpu.sm_clock_mhz, 1: gpu.sm_clock_mhz, 2: gpu.memory_clock_mhz}
        )
        if kind not in (0, 1, 2, 3):
            raise NvmlReturn(INVALID_ARGUMENT)
        return int(_need(table.get(kind)))

    def _nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, clock: Any) -> int:
        _out(clock).value = self._clock(self._dev(handle, "nvmlDeviceGetClockInfo"), _v(kind), False)
        return SUCCESS

    def _nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: Any, clock: Any) -> int:
        _out(clock).value = self._clock(self._dev(handle, "nvmlDeviceGetMaxClockInfo"), _v(kind), True)
        return SUCCESS

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        _out(reasons).value = self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons
        return SUCCESS

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, reasons: Any) -> int:
        _out(reasons).value = self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons
        return SUCCESS

    def _nvmlDeviceGetPerformanceState(self, handle: Any, pstate: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetPerformanceState")
        ps = _need(gpu.pstate if gpu.pstate is not None else gpu.profile.pstate)
        _out(pstate).value = int(ps.lstrip("Pp")) if ps.lstrip("Pp").isdigit() else 32
        return SUCCESS

    def _nvmlDeviceGetPersistenceMode(self, handle: Any, mode: Any) -> int:
        _out(mode).value = int(_need(self._dev(handle, "nvmlDeviceGetPersistenceMode").persistence))
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        m = _out(ref)
        total = int(_need(gpu.profile.memory_total_mib)) * (1 << 20)
        used = min(total, gpu.memory_used_bytes())
        m.total, m.used, m.free = total, used, total - used
        return SUCCESS

    # ---- fans (%) ----
    def _fan(self, gpu: FakeGpu, fan: Any) -> Any:
        if not gpu.fans:
            raise NvmlReturn(NOT_SUPPORTED)
        i = _v(fan)
        if not 0 <= i < len(gpu.fans):
            raise NvmlReturn(INVALID_ARGUMENT)
        return gpu.fans[i]

    def _nvmlDeviceGetNumFans(self, handle: Any, count: Any) -> int:
        _out(count).value = len(self._dev(handle, "nvmlDeviceGetNumFans").fans)
        return SUCCESS

    def _nvmlDeviceGetFanSpeed(self, handle: Any, speed: Any) -> int:
        _out(speed).value = self._fan(self._dev(handle, "nvmlDeviceGetFanSpeed"), 0).speed_pct
        return SUCCESS

    def _nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: Any, speed: Any) -> int:
        _out(speed).value = self._fan(self._dev(handle, "nvmlDeviceGetFanSpeed_v2"), fan).speed_pct
        return SUCCESS

    def _nvmlDeviceGetTargetFanSpeed(self, handle: Any, fan: Any, speed: Any) -> int:
        _out(speed).value = self._fan(self._dev(handle, "nvmlDeviceGetTargetFanSpeed"), fan).target_pct
        return SUCCESS

    def _nvmlDeviceGetMinMaxFanSpeed(self, handle: Any, lo: Any, hi: Any) -> int:
        self._fan(self._dev(handle, "nvmlDeviceGetMinMaxFanSpeed"), 0)
        _out(lo).value, _out(hi).value = 0, 100
        return SUCCESS

    def _nvmlDeviceGetFanControlPolicy_v2(self, handle: Any, fan: Any, policy: Any) -> int:
        f = self._fan(self._dev(handle, "nvmlDeviceGetFanControlPolicy_v2"), fan)
        _out(policy).value = FAN_POLICY_MANUAL if f.manual else FAN_POLICY_AUTO
        return SUCCESS

    def _nvmlDeviceSetFanSpeed_v2(self, handle: Any, fan: Any, speed: Any) -> int:
        f = self._fan(self._dev(handle, "nvmlDeviceSetFanSpeed_v2"), fan)
        self._write_allowed()
        duty = _v(speed)
        if not 0 <= duty <= 100:
            raise NvmlReturn(INVALID_ARGUMENT)
        f.target_pct = f.speed_pct = duty
        f.manual = True
        self._persist()
        return SUCCESS

    def _nvmlDeviceSetDefaultFanSpeed_v2(self, handle: Any, fan: Any) -> int:
        f = self._fan(self._dev(handle, "nvmlDeviceSetDefaultFanSpeed_v2"), fan)
        self._write_allowed()
        f.manual = False
        f.target_pct = f.speed_pct = f.auto_pct
        self._persist()
        return SUCCESS

    # ---- batched fields ----
    def _field(self, gpu: FakeGpu, fid: int) -> tuple[int, int]:
        if fid not in FIELD_SINCE or self.driver_branch < FIELD_SINCE[fid]:
            raise NvmlReturn(NOT_SUPPORTED)
        if fid in (FI_TOTAL_ENERGY, FI_ENERGY):
            _need(gpu.power_mw if gpu.energy_counter else None)
            return VT_ULL, gpu.energy_mj
        value = {
            FI_MEMORY_TEMP: None if gpu.memory_temp_c is None else int(round(gpu.memory_temp_c)),
            FI_POWER_AVERAGE: gpu.power_mw,
            FI_POWER_INSTANT: gpu.power_mw,
            FI_POWER_MIN: gpu.min_mw,
            FI_POWER_MAX: gpu.max_mw,
            FI_POWER_DEFAULT: gpu.default_mw,
            FI_POWER_CURRENT_LIMIT: gpu.enforced_mw,
            FI_POWER_REQUESTED_LIMIT: gpu.limit_mw,
        }[fid]
        return VT_UINT, _need(value)

    def _nvmlDeviceGetFieldValues(self, handle: Any, count: Any, ref: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetFieldValues")
        values = _out(ref)
        now_us = time.time_ns() // 1000
        for i in range(_v(count)):
            fv = values[i]
            fv.timestamp, fv.latencyUsec = now_us, 0
            try:
                fv.valueType, raw = self._field(gpu, fv.fieldId)
            except NvmlReturn as exc:
                fv.nvmlReturn = exc.code
                continue
            fv.nvmlReturn = SUCCESS
            if fv.valueType == VT_ULL:
                fv.value.ullVal = raw
            else:
                fv.value.uiVal = raw
        return SUCCESS
