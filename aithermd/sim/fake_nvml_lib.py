"""The C entry points of the fake NVML, called by the real ``pynvml`` bindings with their ctypes arguments.

Each ``_nvmlX`` method implements the NVML C function ``nvmlX`` (NVML API reference, nvml.h): it reads its
inputs from ctypes values, writes outputs through the ``byref()`` pointers the bindings pass, and returns
an ``nvmlReturn_t`` code; failures are raised internally as :class:`NvmlReturn` and turned into that code by
the caller (:class:`aithermd.sim.fake_nvml.FakeNvml`). Units are NVML's: mW, mJ, °C, %, MHz.
"""

from __future__ import annotations

import ctypes
from types import MappingProxyType
from typing import Any

from aithermd.sim.fake_nvml_state import FakeGpu

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 0, 1, 2, 3, 4
NOT_FOUND, INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, FUNCTION_NOT_FOUND, GPU_IS_LOST = 6, 7, 9, 13, 15
ARGUMENT_VERSION_MISMATCH, UNKNOWN = 25, 999
ERROR_STRINGS = MappingProxyType(
    {
        0: "Success",
        1: "Uninitialized",
        2: "Invalid Argument",
        3: "Not Supported",
        4: "Insufficient Permissions",
        5: "Already Initialized",
        6: "Not Found",
        7: "Insufficient Size",
        8: "Insufficient External Power",
        9: "Driver Not Loaded",
        10: "Timeout",
        11: "Interrupt Request Issue",
        12: "NVML Shared Library Not Found",
        13: "Function Not Found",
        14: "Corrupted infoROM",
        15: "GPU is lost",
        16: "GPU requires restart",
        17: "The operating system has blocked the request.",
        18: "RM has detected an NVML/RM version mismatch.",
        19: "In use by another client",
        20: "Insufficient Memory",
        21: "No data",
        999: "Unknown Error",
    }
)
TEMPERATURE_V1 = 0x100000C  # nvmlTemperature_v1: sizeof(nvmlTemperature_v1_t) | 1 << 24
FAN_POLICY_AUTO, FAN_POLICY_MANUAL = 0, 1  # NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW, NVML_FAN_POLICY_MANUAL
# field ids (nvml.h NVML_FI_DEV_*) the fake answers, and the oldest driver branch that has them
FI_MEMORY_TEMP, FI_TOTAL_ENERGY = 82, 83
FI_POWER_AVERAGE, FI_POWER_INSTANT, FI_POWER_MIN, FI_POWER_MAX, FI_POWER_DEFAULT = 185, 186, 187, 188, 189
FI_POWER_CURRENT_LIMIT, FI_ENERGY, FI_POWER_REQUESTED_LIMIT = 190, 191, 192
FIELD_SINCE = MappingProxyType({FI_MEMORY_TEMP: 0, FI_TOTAL_ENERGY: 0, **{f: 535 for f in range(185, 193)}})
VT_UINT, VT_ULL = 1, 3  # NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# entry points newer than some drivers: older branches raise FUNCTION_NOT_FOUND (approximate branch numbers)
FUNCTION_SINCE = MappingProxyType(
    {
        "nvmlGpmQueryDeviceSupport": 520,
        "nvmlGpmSampleAlloc": 520,
        "nvmlGpmSampleFree": 520,
        "nvmlGpmSampleGet": 520,
        "nvmlGpmMetricsGet": 520,
        "nvmlDeviceSetGpuLockedClocks": 418,
        "nvmlDeviceResetGpuLockedClocks": 418,
        "nvmlDeviceGetTemperatureV": 555,
        "nvmlDeviceGetCurrentClocksEventReasons": 535,
        "nvmlDeviceGetFanControlPolicy_v2": 520,
        "nvmlDeviceSetFanSpeed_v2": 495,
        "nvmlDeviceSetDefaultFanSpeed_v2": 495,
        "nvmlDeviceGetTargetFanSpeed": 495,
        "nvmlDeviceGetMinMaxFanSpeed": 495,
        "nvmlDeviceGetNumFans": 460,
        "nvmlDeviceGetFanSpeed_v2": 460,
        "nvmlDeviceGetComputeRunningProcesses_v3": 510,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 510,
        "nvmlDeviceGetComputeRunningProcesses_v2": 450,
        "nvmlDeviceGetGraphicsRunningProcesses_v2": 450,
    }
)
HANDLE_BASE = 0x4E560000
HANDLE_EPOCH = 0x100  # a handle is HANDLE_BASE + epoch × HANDLE_EPOCH + position: a GPU back from a reset
# (revive_gpu) has a new epoch, so a handle from before answers GPU_IS_LOST until the GPU is looked up again


class NvmlReturn(Exception):
    """An NVML return code other than NVML_SUCCESS, raised inside the fake and returned to the caller."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _v(arg: Any) -> Any:
    """The value of a ctypes scalar or a plain Python int/bytes argument (a float fails as ctypes would)."""
    if isinstance(arg, float):
        raise ctypes.ArgumentError("Don't know how to convert parameter: float")
    return arg.value if hasattr(arg, "value") else arg


def _out(ref: Any) -> Any:
    """The object a ``byref()`` / ``pointer()`` argument points at."""
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if ref is None:
        raise NvmlReturn(INVALID_ARGUMENT)
    return ref.contents


def _put_string(buf: Any, size: Any, text: str) -> None:
    raw = text.encode()
    if len(raw) + 1 > _v(size):
        raise NvmlReturn(INSUFFICIENT_SIZE)
    buf.value = raw


def _need(value: Any) -> Any:
    if value is None:
        raise NvmlReturn(NOT_SUPPORTED)
    return value


class NvmlFunctions:
    """Mixin: the C functions. The host class provides ``_dev(handle, name)``, ``_present()``,
    ``_ensure_init()``, ``_write_allowed()``, ``_persist()``, ``_refcount``, ``driver_loaded``,
    ``driver_version``, ``driver_branch``."""

    # ---- library ----
    def _nvmlInitWithFlags(self, flags: Any = 0) -> int:
        if not self.driver_loaded:
            raise NvmlReturn(DRIVER_NOT_LOADED)
        if self._refcount <= 0:
            self._broken = None  # a fresh session: whatever broke the last one is behind us
        self._refcount += 1
        return SUCCESS

    def _nvmlInit_v2(self) -> int:
        return self._nvmlInitWithFlags(0)

    _nvmlInit = _nvmlInit_v2

    def _nvmlShutdown(self) -> int:
        self._ensure_init()
        self._refcount -= 1
        if self._refcount <= 0:
            self._broken = None
        return SUCCESS

    def _nvmlErrorString(self, result: Any) -> bytes:
        return ERROR_STRINGS.get(_v(result), "Unknown Error").encode()

    def _nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        self._ensure_init()
        _put_string(buf, size, self.driver_version)
        return SUCCESS

    def _nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        _put_string(buf, size, f"12.{self.driver_version}")
        return SUCCESS

    # ---- enumeration ----
    def _nvmlDeviceGetCount_v2(self, count: Any) -> int:
        self._ensure_init()
        _out(count).value = len(self._present())
        return SUCCESS

    _nvmlDeviceGetCount = _nvmlDeviceGetCount_v2

    def _give_handle(self, gpu: FakeGpu, ref: Any) -> int:
        ctypes.c_void_p.from_buffer(_out(ref)).value = (HANDLE_BASE + gpu.epoch * HANDLE_EPOCH
                                                         + self.gpus.index(gpu))
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        self._ensure_init()
        present, i = self._present(), _v(index)
        if not 0 <= i < len(present):
            raise NvmlReturn(INVALID_ARGUMENT)
        if present[i].lost:
            raise NvmlReturn(GPU_IS_LOST)
        self._check_injected("nvmlDeviceGetHandleByIndex_v2", present[i])
        return self._give_handle(present[i], ref)

    def _by_text(self, attr: str, key: Any, ref: Any) -> int:
        self._ensure_init()
        text = _v(key)
        text = text.decode() if isinstance(text, bytes) else str(text)
        for gpu in self._present():
            if getattr(gpu, attr).upper() == text.upper():
                return self._give_handle(gpu, ref)
        raise NvmlReturn(NOT_FOUND)

    def _nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        return self._by_text("uuid", uuid, ref)

    def _nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, ref: Any) -> int:
        return self._by_text("bus_id", bus_id, ref)

    def _nvmlDeviceGetIndex(self, handle: Any, index: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetIndex")
        _out(index).value = self._present().index(gpu)
        return SUCCESS

    # ---- identity ----
    def _nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        _put_string(buf, size, self._dev(handle, "nvmlDeviceGetUUID").uuid)
        return SUCCESS

    def _nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        _put_string(
            buf, size, self._dev(handle, "nvmlDeviceGetName").profile.name or "NVIDIA Graphics Device"
        )
        return SUCCESS

    def _nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetPciInfo_v3")
        info = _out(ref)
        dom, bus, rest = gpu.bus_id.split(":")
        dev, _fn = rest.split(".")
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = f"{int(dom, 16) & 0xFFFF:04X}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(dev, 16)
        info.pciDeviceId = int(gpu.profile.extra.get("pci_device_id", "0").removeprefix("0x"), 16)
        return SUCCESS

    # ---- temperatures (°C) ----
    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTemperature")
        if _v(sensor) != 0:  # NVML_TEMPERATURE_GPU
            raise NvmlReturn(INVALID_ARGUMENT)
        _out(temp).value = int(round(_need(gpu.temp_c)))
        return SUCCESS

    def _nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTemperatureV")
        st = _out(ref)
        if st.version != TEMPERATURE_V1:
            raise NvmlReturn(ARGUMENT_VERSION_MISMATCH)
        if st.sensorType != 0:
            raise NvmlReturn(INVALID_ARGUMENT)
        st.temperature = int(round(_need(gpu.temp_c)))
        return SUCCESS

    def _nvmlDeviceGetTemperatureThreshold(self, handle: Any, kind: Any, temp: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTemperatureThreshold")
        p, acoustic = gpu.profile, gpu.acoustic_range_c or (None, None)
        table = {
            0: p.shutdown_temp_c,
            1: p.slowdown_temp_c,
            2: p.memory_max_temp_c,
            3: p.max_operating_temp_c,
            4: acoustic[0],
            5: p.target_temp_c if gpu.target_temp_c is None else gpu.target_temp_c,
            6: acoustic[1],
            7: None,
        }
        if _v(kind) not in table:
            raise NvmlReturn(INVALID_ARGUMENT)
        _out(temp).value = int(round(_need(table[_v(kind)])))
        return SUCCESS

    def _nvmlDeviceSetTemperatureThreshold(self, handle: Any, kind: Any, temp: Any) -> int:
        """Only the acoustic threshold (ACOUSTIC_CURR) is settable, within ACOUSTIC_MIN–MAX."""
        gpu = self._dev(handle, "nvmlDeviceSetTemperatureThreshold")
        if _v(kind) != 5 or gpu.acoustic_range_c is None:
            raise NvmlReturn(NOT_SUPPORTED if _v(kind) == 5 else INVALID_ARGUMENT)
        self._write_allowed()
        value = int(_v(_out(temp)))
        if not gpu.acoustic_range_c[0] <= value <= gpu.acoustic_range_c[1]:
            raise NvmlReturn(INVALID_ARGUMENT)
        gpu.target_temp_c = value
        self._persist()
        return SUCCESS

    # ---- power (mW) and energy (mJ) ----
    def _nvmlDeviceGetPowerUsage(self, handle: Any, power: Any) -> int:
        _out(power).value = _need(self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw)
        return SUCCESS

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, energy: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption")
        _need(gpu.power_mw if gpu.energy_counter else None)
        _out(energy).value = gpu.energy_mj
        return SUCCESS

    def _nvmlDeviceGetPowerManagementMode(self, handle: Any, mode: Any) -> int:
        _out(mode).value = int(self._dev(handle, "nvmlDeviceGetPowerManagementMode").limit_mw is not None)
        return SUCCESS

    def _nvmlDeviceGetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        _out(limit).value = _need(self._dev(handle, "nvmlDeviceGetPowerManagementLimit").limit_mw)
        return SUCCESS

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, limit: Any) -> int:
        _out(limit).value = _need(self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").enforced_mw)
        return SUCCESS

    def _nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, limit: Any) -> int:
        _out(limit).value = _need(self._dev(handle, "nvmlDeviceGetPowerManagementDefaultLimit").default_mw)
        return SUCCESS

    def _nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, lo: Any, hi: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
        _out(lo).value, _out(hi).value = _need(gpu.min_mw), _need(gpu.max_mw)
        return SUCCESS

    def _nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        gpu = self._dev(handle, "nvmlDeviceSetPowerManagementLimit")
        mw = _v(limit)
        lo, hi = _need(gpu.min_mw), _need(gpu.max_mw)
        self._write_allowed()
        if not lo <= mw <= hi or mw < (gpu.limit_refused_below_mw or lo):
            raise NvmlReturn(INVALID_ARGUMENT)
        if gpu.limit_step_mw:
            mw = min(hi, max(lo, int(round(mw / gpu.limit_step_mw)) * gpu.limit_step_mw))
        gpu.limit_mw = max(mw, gpu.limit_floor_mw or mw)
        self._persist()
        return SUCCESS
