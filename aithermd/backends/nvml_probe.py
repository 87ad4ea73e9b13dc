"""One NVIDIA GPU seen through NVML: what it can do, probed once at discovery.

Source of the facts: the NVML API reference (nvml.h): power and limits in mW, energy in mJ, temperatures in
°C, utilization and fan speed in %, clocks in MHz; ``nvmlDeviceGetFieldValues`` batches power, energy,
memory temperature and limit reads (per-field ``nvmlReturn``); ``nvmlDeviceGetTemperatureV`` and
``nvmlDeviceGetCurrentClocksEventReasons`` replace ``nvmlDeviceGetTemperature`` and
``...ClocksThrottleReasons`` (older drivers: ``NVML_ERROR_FUNCTION_NOT_FOUND``, then the older call is used).

Error classes are kept apart: ``NOT_SUPPORTED`` at discovery = the capability is absent (no channel or
knob), and on an informational query (name, PCI info, thresholds) a fallback, never a dropped GPU;
``NO_PERMISSION`` = the knob is read-only with the reason; ``GPU_IS_LOST`` = this GPU is lost
(:class:`Lost`: the caller reports it in ``Sample.lost``); ``UNKNOWN``, ``UNINITIALIZED``,
``LIB_RM_VERSION_MISMATCH`` and ``DRIVER_NOT_LOADED`` on a read = NVML itself needs initialising again
(:class:`Down`); anything else = that reading failed. A *write* (``nvmlDeviceSet*``/``Reset*``) that fails
with anything but ``GPU_IS_LOST`` is a fault of that knob, never of the GPU: the reads tell whether the GPU
or NVML is down (one set call broken on one board or driver branch must not take the GPU down with it), and
a probe write (:meth:`GpuProbe.probe_write`) only tells whether the knob may be written.

GPUs without an energy counter (``nvmlDeviceGetTotalEnergyConsumption`` is "for Volta or newer": Pascal
and older answer ``NOT_SUPPORTED``) get an ``energy`` channel integrated from power, marked
``Channel.estimated``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from aithermd import units
from aithermd.backends import nvml_acoustic
from aithermd.backends.nvml_clocks import CHANNEL, KNOB, GpuClocks
from aithermd.backends.plausible import temperature_range
from aithermd.model import (
    UNITS,
    Channel,
    Device,
    DeviceKind,
    Knob,
    KnobKind,
    Quantity,
)

PLAUSIBLE = MappingProxyType(
    {
        Quantity.TEMPERATURE: temperature_range("nvml", {}),  # a die: above 0 °C (plausible.DIE_FLOOR_C)
        Quantity.POWER: (0.0, 5000.0),
        Quantity.ENERGY: (0.0, math.inf),
        Quantity.UTILIZATION: (0.0, 100.0),
        Quantity.CLOCK: (0.0, 100_000.0),
        Quantity.DUTY: (0.0, 100.0),
    }
)
REASONS = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks_setting"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal_slowdown"),
    ("HwThermalSlowdown", "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
    ("DisplayClockSetting", "display_clocks_setting"),
    ("BoardLimit", "board_limit"),  # nvml.h: clocks held down by a board-level limit
    ("Reliability", "reliability"),  # nvml.h: clocks held down for reliability
)
# role → NVML field ids in order of preference (nvml.h NVML_FI_DEV_*), and the single call used without one
FIELD_ROLES = (
    ("power", ("NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_POWER_INSTANT"), "nvmlDeviceGetPowerUsage"),
    ("energy", ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), "nvmlDeviceGetTotalEnergyConsumption"),
    ("memory_temperature", ("NVML_FI_DEV_MEMORY_TEMP",), None),
    ("limit", ("NVML_FI_DEV_POWER_REQUESTED_LIMIT",), "nvmlDeviceGetPowerManagementLimit"),
    ("enforced", ("NVML_FI_DEV_POWER_CURRENT_LIMIT",), "nvmlDeviceGetEnforcedPowerLimit"),
)
CHANNEL_ORDER = (
    "temperature",
    "memory_temperature",
    "power",
    "energy",
    "utilization",
    "memory_utilization",
    "sm_clock",
    "memory_clock",
    "tensor_activity",
)
_ROLE_CHANNEL = MappingProxyType(
    {
        "power": (Quantity.POWER, units.mw_to_w),
        "energy": (Quantity.ENERGY, units.mj_to_j),
        "memory_temperature": (Quantity.TEMPERATURE, float),
    }
)


class Lost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus."""


class Down(Exception):
    """An NVML error that only initialising NVML again can cure (``args[0]``: its name): Unknown Error
    (nvidia-container-toolkit after a cgroup reload, a driver in recovery), a library/driver version
    mismatch after a driver upgrade, the driver unloaded, NVML uninitialised under us."""


# nvml.h codes whose cure is nvmlShutdown + nvmlInit (and, for a version mismatch, a reboot or module reload)
# UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH, UNKNOWN
REINIT_CODES = frozenset({1, 9, 18, 999})
NOT_SUPPORTED_CODES = frozenset({3, 13})  # NOT_SUPPORTED, FUNCTION_NOT_FOUND
DENIED_CODES = frozenset({3, 4, 13})  # ... and NO_PERMISSION: what a probe write can say of its knob
WRITES = ("nvmlDeviceSet", "nvmlDeviceReset")  # function name prefixes of the calls that change a setting


def error_names(nv: Any) -> dict[int, str]:
    """Code → name (15 → ``NVML_ERROR_GPU_IS_LOST``) from the bindings' own constants."""
    return {
        getattr(nv, n): n for n in dir(nv) if n.startswith("NVML_ERROR_") and isinstance(getattr(nv, n), int)
    }


def error_name(nv: Any, code: int, names: dict[int, str] | None = None) -> str:
    return (names if names is not None else error_names(nv)).get(code, f"NVML_ERROR_{code}")


class GpuProbe:
    """GPU ``index`` (NVML enumeration order) behind ``handle``; device id ``gpu<index>``. ``partial``: a
    re-init cured nothing, its other calls answer (:mod:`.nvml_reprobe`): a read's REINIT code fails it."""

    partial = False

    def __init__(
        self,
        nv: Any,
        index: int,
        handle: Any,
        probe_writes: bool = True,
        names: dict[int, str] | None = None,
        device_index: int | None = None,
    ) -> None:
        self.nv, self.index, self.handle, self.probe_writes = nv, index, handle, probe_writes
        self.uuid: str | None = None  # set by probe()
        self.beat: Callable[[], None] | None = None  # told as each NVML call begins (the worker's deadline)
        self.bus_id = ""  # set by probe(); "" when the GPU does not report its PCI info
        self.estimate_energy = False  # no energy counter: integrated from power
        self.unsupported: dict[str, float] = {}  # role → monotonic time it is asked again (NO_DATA repeated)
        self._no_data: dict[str, int] = {}
        self._est: tuple[float, float | None, float] | None = None  # (t, W, J) of the last energy estimate
        self.names = names if names is not None else error_names(nv)
        self.id = f"gpu{index if device_index is None else device_index}"
        self.fields: list[tuple[str, int]] = []  # (role, field id) read in one batch
        self.calls: dict[str, Callable[[], Any]] = {}  # role → single call, where no field serves it
        self.temp_fn: Callable[[], Any] | None = None
        self.util = self.clocks = self.pstate = self.persistence = False
        self.reasons_fn: Callable[[], int] | None = None
        self.reason_bits = [(getattr(nv, f"nvmlClocksThrottleReason{c}", 0), n) for c, n in REASONS]
        self.fans: list[int] = []
        self.fan_v1 = self.fan_policy = self.fan_target = False
        self.channels: dict[str, Channel] = {}
        self.knobs: dict[str, Knob] = {}
        self.extra = GpuClocks(self.id)  # locked clocks, GPM, processes (nvml_clocks.py)

    # -- helpers ---------------------------------------------------------------------------------------
    def code(self, exc: Exception) -> int:
        return getattr(exc, "value", -1)

    def call(self, name: str, *args: Any) -> Any:
        """``nv.<name>(handle, *args)``; GPU_IS_LOST raises :class:`Lost`, the codes of
        :data:`REINIT_CODES` raise :class:`Down` from a read (from a write: NVMLError, the knob's fault); a
        function this pynvml lacks raises NVMLError(FUNCTION_NOT_FOUND) like a driver that lacks it."""
        fn = getattr(self.nv, name, None)
        if fn is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self.beat is not None:
            self.beat()
        try:
            return fn(self.handle, *args)
        except self.nv.NVMLError as exc:
            if exc.value == self.nv.NVML_ERROR_GPU_IS_LOST:
                raise Lost(self.id) from exc
            if exc.value in REINIT_CODES and not name.startswith(WRITES) and not self.partial:
                raise Down(self.names.get(exc.value, f"NVML_ERROR_{exc.value}")) from exc
            raise

    def attempt(self, name: str, *args: Any) -> tuple[Any, int | None]:
        """(value, None) or (None, NVML error code)."""
        try:
            return self.call(name, *args), None
        except self.nv.NVMLError as exc:
            return None, exc.value

    def probe_write(self, name: str, *args: Any) -> int | None:
        """A write that changes nothing, asked at discovery: the NVML code when it says this process may not
        write the knob (:data:`DENIED_CODES`), else None: any other failure (UNKNOWN, GPU_IS_LOST) is the
        write's, met again and reported when the daemon writes, never a verdict on the knob or the GPU."""
        try:
            code = self.attempt(name, *args)[1]
        except Lost:
            return None
        return code if code in DENIED_CODES else None

    def why(self, code: int, what: str) -> str:
        return f"{self.names.get(code, f'NVML_ERROR_{code}')}: {what}"

    def _channel(
        self,
        attribute: str,
        quantity: Quantity,
        thresholds: dict[str, float] | None = None,
        estimated: bool = False,
    ) -> None:
        cid = f"{self.id}/{attribute}"
        self.channels[attribute] = Channel(
            cid, self.id, attribute, quantity, UNITS[quantity], thresholds=thresholds or {},
            estimated=estimated,
        )

    def _info(self, name: str, fallback: Any) -> Any:
        """An informational query; ``fallback`` when the GPU does not support it (never a dropped GPU)."""
        value, code = self.attempt(name)
        if code is not None and code not in NOT_SUPPORTED_CODES and code != self.nv.NVML_ERROR_NO_PERMISSION:
            raise self.nv.NVMLError(code)
        return fallback if code is not None else value

    # -- discovery -------------------------------------------------------------------------------------
    def probe(self) -> Device:
        """Decide every capability once (raises :class:`Lost` if the GPU is lost meanwhile)."""
        nv = self.nv
        uuid = self.call("nvmlDeviceGetUUID")
        self.uuid = uuid
        name = self._info("nvmlDeviceGetName", None) or "NVIDIA GPU"
        pci = self._info("nvmlDeviceGetPciInfo_v3", None)
        bus = pci.busId if pci is not None else ""
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        self.bus_id = bus
        self._probe_temperature()
        self._probe_fields()
        self.util = self.attempt("nvmlDeviceGetUtilizationRates")[1] is None
        if self.util:
            self._channel("utilization", Quantity.UTILIZATION)
            self._channel("memory_utilization", Quantity.UTILIZATION)
        self.clocks = self.attempt("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)[1] is None
        if self.clocks:
            self._channel("sm_clock", Quantity.CLOCK)
            self._channel("memory_clock", Quantity.CLOCK)
        for fname in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            code = self.attempt(fname)[1]
            if code is None:
                self.reasons_fn = lambda f=fname: self.call(f)
            if code != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                break
        self.pstate = self.attempt("nvmlDeviceGetPerformanceState")[1] is None
        self.persistence = self.attempt("nvmlDeviceGetPersistenceMode")[1] is None
        self._probe_power_knob()
        nvml_acoustic.probe(self)
        self._probe_fans()
        power = self.knobs.get("power_limit")
        why = power.why_not if power is not None else (
            self.why(nv.NVML_ERROR_NO_PERMISSION, "locking clocks needs root") if os.geteuid() != 0 else None)
        self.extra.probe(self, why)
        if self.extra.knob is not None:
            self.knobs[KNOB] = self.extra.knob
        if self.extra.channel is not None:
            self.channels[CHANNEL] = self.extra.channel
        order = {a: i for i, a in enumerate(CHANNEL_ORDER)}
        self.channels = dict(sorted(self.channels.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])))
        return Device(id=self.id, kind=DeviceKind.GPU, name=name, channels=tuple(self.channels.values()),
                      knobs=tuple(self.knobs.values()),
                      info={"uuid": uuid, "pci_bus_id": bus, "name": name, "index": self.index})

    def _probe_temperature(self) -> None:
        nv = self.nv
        for fname, args in (
            ("nvmlDeviceGetTemperatureV", (nv.NVML_TEMPERATURE_GPU,)),
            ("nvmlDeviceGetTemperature", (nv.NVML_TEMPERATURE_GPU,)),
        ):
            code = self.attempt(fname, *args)[1]
            if code is None or code in REINIT_CODES:  # (a REINIT code only when partial: kept, failing)
                self.temp_fn, self.temp_raw = (lambda f=fname, a=args: self.call(f, *a)), (fname, args)
                break
            if code != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                return
        if self.temp_fn is None:
            return
        thresholds = {}
        for key, const in (("slowdown", "SLOWDOWN"), ("shutdown", "SHUTDOWN"), ("max_operating", "GPU_MAX")):
            value, code = self.attempt(
                "nvmlDeviceGetTemperatureThreshold", getattr(nv, f"NVML_TEMPERATURE_THRESHOLD_{const}")
            )
            if code is None:
                thresholds[key] = float(value)
        self._channel("temperature", Quantity.TEMPERATURE, thresholds)

    def _probe_fields(self) -> None:
        nv = self.nv
        wanted = [
            (role, getattr(nv, fid)) for role, fids, _ in FIELD_ROLES for fid in fids if hasattr(nv, fid)
        ]
        ok: set[int] = set()
        try:
            values = self.call("nvmlDeviceGetFieldValues", [fid for _, fid in wanted])
            ok = {v.fieldId for v in values if v.nvmlReturn == nv.NVML_SUCCESS}
        except nv.NVMLError:
            pass
        for role, _fids, single in FIELD_ROLES:
            fid = next((f for r, f in wanted if r == role and f in ok), None)
            if fid is not None:
                self.fields.append((role, fid))
            elif single is not None and self.attempt(single)[1] is None:
                self.calls[role] = lambda s=single: self.call(s)
            else:
                continue
            if role in _ROLE_CHANNEL:
                thresholds: dict[str, float] = {}
                if role == "memory_temperature":
                    value, code = self.attempt(
                        "nvmlDeviceGetTemperatureThreshold", nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
                    )
                    thresholds = {"max_operating": float(value)} if code is None else {}
                self._channel(role, _ROLE_CHANNEL[role][0], thresholds)
        have = {role for role, _ in self.fields} | set(self.calls)
        if "power" in have and "energy" not in have:
            self.estimate_energy = True  # pre-Volta: nvmlDeviceGetTotalEnergyConsumption not supported
            self._channel("energy", Quantity.ENERGY, estimated=True)

    def _probe_power_knob(self) -> None:
        nv = self.nv
        have = {role for role, _ in self.fields} | set(self.calls)
        if "limit" not in have:
            return  # no power management limit: capability absent
        limit_mw, _ = self.attempt("nvmlDeviceGetPowerManagementLimit")
        bounds, code = self.attempt("nvmlDeviceGetPowerManagementLimitConstraints")
        default, _ = self.attempt("nvmlDeviceGetPowerManagementDefaultLimit")
        lo, hi = (units.mw_to_w(bounds[0]), units.mw_to_w(bounds[1])) if code is None else (None, None)
        why = None if code is None else self.why(code, "no power limit constraints")
        if why is None and not self.probe_writes and os.geteuid() != 0:
            why = self.why(nv.NVML_ERROR_NO_PERMISSION, "setting the power limit needs root")
        if why is None and self.probe_writes and limit_mw is not None:
            # writing the limit in force changes nothing and tells whether NVML lets this process write
            wcode = self.probe_write("nvmlDeviceSetPowerManagementLimit", limit_mw)
            if wcode is not None:
                why = self.why(
                    wcode,
                    "setting the power limit needs root"
                    if wcode == nv.NVML_ERROR_NO_PERMISSION
                    else "the power limit cannot be set",
                )
        kid = f"{self.id}/power_limit"
        self.knobs["power_limit"] = Knob(
            kid, self.id, KnobKind.POWER_LIMIT, UNITS[Quantity.POWER], min=lo, max=hi,
            default=None if default is None else units.mw_to_w(default), writable=why is None, why_not=why,
        )

    def _probe_fans(self) -> None:
        nv = self.nv
        count, code = self.attempt("nvmlDeviceGetNumFans")
        if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
            self.fan_v1 = self.attempt("nvmlDeviceGetFanSpeed")[1] is None
            count = 1 if self.fan_v1 else 0
        self.fan_policy = self.attempt("nvmlDeviceGetFanControlPolicy_v2", 0)[1] is None
        self.fan_target = self.attempt("nvmlDeviceGetTargetFanSpeed", 0)[1] is None
        bounds, bcode = self.attempt("nvmlDeviceGetMinMaxFanSpeed")
        lo, hi = (float(bounds[0]), float(bounds[1])) if bcode is None else (0.0, 100.0)
        for i in range(count or 0):
            if not self.fan_v1 and self.attempt("nvmlDeviceGetFanSpeed_v2", i)[1] is not None:
                continue
            self.fans.append(i)
            self._channel(f"fan{i}", Quantity.DUTY)
            why = self._probe_fan_write(i)
            self.knobs[f"fan{i}"] = Knob(
                f"{self.id}/fan{i}", self.id, KnobKind.FAN, UNITS[Quantity.DUTY], min=lo, max=hi,
                writable=why is None, why_not=why, fan_channel=f"{self.id}/fan{i}",
            )

    def _probe_fan_write(self, fan: int) -> str | None:
        nv = self.nv
        if self.fan_v1 or not self.fan_policy:
            return self.why(
                nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                "nvmlDeviceGetFanControlPolicy_v2 (driver too old to hand the fan back)",
            )
        if not self.probe_writes:
            if os.geteuid() != 0:
                return self.why(nv.NVML_ERROR_NO_PERMISSION, "fan control needs root")
            return None
        policy, _ = self.attempt("nvmlDeviceGetFanControlPolicy_v2", fan)
        if policy == nv.NVML_FAN_POLICY_MANUAL:  # re-assert the manual target: no change
            target = self.attempt("nvmlDeviceGetTargetFanSpeed", fan)[0] if self.fan_target else None
            target = self.attempt("nvmlDeviceGetFanSpeed_v2", fan)[0] if target is None else target
            code = self.probe_write("nvmlDeviceSetFanSpeed_v2", fan, target)
        else:  # already automatic: handing it back to the driver changes nothing
            code = self.probe_write("nvmlDeviceSetDefaultFanSpeed_v2", fan)
        if code is None:
            return None
        return self.why(
            code,
            "fan control needs root" if code == nv.NVML_ERROR_NO_PERMISSION else "fan speed cannot be set",
        )

    # -- one read --------------------------------------------------------------------------------------
