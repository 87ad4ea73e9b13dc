"""One NVIDIA GPU seen through NVML: one read of every channel, knob and attribute it has.

Source of the facts: the NVML API reference (nvml.h), units as in :mod:`aithermd.backends.nvml_probe`,
which decides at discovery what is read here. A failing call gives its reading ``failed`` (or
``not_supported``) with the NVML error name as detail; ``NVML_ERROR_GPU_IS_LOST`` raises :class:`Lost`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aithermd import units
from aithermd.backends.nvml_probe import _ROLE_CHANNEL, PLAUSIBLE, GpuProbe, Lost, error_names
from aithermd.model import KnobValue, Reading, Status

__all__ = ["GpuReader", "Lost", "error_names"]


class GpuReader(GpuProbe):
    """GPU ``index`` (NVML enumeration order) behind ``handle``; device id ``gpu<index>``; call
    :meth:`probe` once, then :meth:`read` every tick."""

    def read(
        self, readings: dict[str, Reading], knobs: dict[str, KnobValue], attrs: dict[str, dict[str, Any]]
    ) -> None:
        """Read every channel, knob and attribute of this GPU into the given dicts (raises :class:`Lost`)."""
        nv = self.nv
        raw: dict[str, Any] = {}
        failed: dict[str, str] = {}

        def grab(role: str, fn: Callable[[], Any]) -> None:
            try:
                raw[role] = fn()
            except nv.NVMLError as exc:
                failed[role] = self._detail(exc)

        if self.fields:
            try:
                values = self.call("nvmlDeviceGetFieldValues", [fid for _, fid in self.fields])
                for (role, _), v in zip(self.fields, values, strict=True):
                    if v.nvmlReturn == nv.NVML_SUCCESS:
                        raw[role] = (
                            v.value.ullVal
                            if v.valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                            else v.value.uiVal
                        )
                    else:
                        failed[role] = self.names.get(v.nvmlReturn, f"NVML_ERROR_{v.nvmlReturn}")
            except nv.NVMLError as exc:
                failed.update((role, self._detail(exc)) for role, _ in self.fields)
        for role, fn in self.calls.items():
            grab(role, fn)
        if self.temp_fn is not None:
            grab("temperature", self.temp_fn)
        if self.util:
            grab("util", lambda: self.call("nvmlDeviceGetUtilizationRates"))
        if self.clocks:
            grab("sm_clock", lambda: self.call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
            grab("memory_clock", lambda: self.call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM))
        for i in self.fans:
            grab(
                f"fan{i}",
                (lambda: self.call("nvmlDeviceGetFanSpeed"))
                if self.fan_v1
                else (lambda i=i: self.call("nvmlDeviceGetFanSpeed_v2", i)),
            )
        self._readings(raw, failed, readings)
        self._knob_values(raw, failed, knobs)
        self._attrs(attrs)

    def _detail(self, exc: Any) -> str:
        return self.names.get(exc.value, f"NVML_ERROR_{exc.value}")

    def _readings(self, raw: dict[str, Any], failed: dict[str, str], out: dict[str, Reading]) -> None:
        util = raw.get("util")
        if util is not None:
            raw["utilization"], raw["memory_utilization"] = util.gpu, util.memory
        if "util" in failed:
            failed["utilization"] = failed["memory_utilization"] = failed["util"]
        for attribute, channel in self.channels.items():
            convert = _ROLE_CHANNEL.get(attribute, (None, float))[1]
            value = raw.get(attribute)
            if value is None:
                detail = failed.get(attribute, "no value")
                status = Status.NOT_SUPPORTED if detail == "NVML_ERROR_NOT_SUPPORTED" else Status.FAILED
                out[channel.id] = Reading(channel.id, None, status, detail)
                continue
            value = convert(value)
            lo, hi = PLAUSIBLE[channel.quantity]
            out[channel.id] = (
                Reading(channel.id, value)
                if lo <= value <= hi
                else Reading(channel.id, None, Status.IMPLAUSIBLE, f"{value:g} {channel.unit} out of range")
            )

    def _knob_values(self, raw: dict[str, Any], failed: dict[str, str], out: dict[str, KnobValue]) -> None:
        knob = self.knobs.get("power_limit")
        if knob is not None:
            limit = raw.get("limit")
            extra = {"enforced_w": units.mw_to_w(raw["enforced"])} if raw.get("enforced") is not None else {}
            out[knob.id] = (
                KnobValue(knob.id, units.mw_to_w(limit), None, Status.OK, extra)
                if limit is not None
                else KnobValue(knob.id, None, None, Status.FAILED, extra)
            )
        for i in self.fans:
            out[f"{self.id}/fan{i}"] = self.fan_value(i, raw.get(f"fan{i}"))

    def fan_value(self, fan: int, speed: Any = None) -> KnobValue:
        """The fan knob as read back: the target duty under manual control, the duty itself otherwise."""
        nv, kid = self.nv, f"{self.id}/fan{fan}"
        try:
            mode = None
            if self.fan_policy:
                mode = (
                    "manual"
                    if self.call("nvmlDeviceGetFanControlPolicy_v2", fan) == nv.NVML_FAN_POLICY_MANUAL
                    else "auto"
                )
            if mode == "manual" and self.fan_target:
                speed = self.call("nvmlDeviceGetTargetFanSpeed", fan)
            elif speed is None:
                speed = (
                    self.call("nvmlDeviceGetFanSpeed")
                    if self.fan_v1
                    else self.call("nvmlDeviceGetFanSpeed_v2", fan)
                )
        except nv.NVMLError:
            return KnobValue(kid, None, None, Status.FAILED)
        return KnobValue(kid, float(speed), mode)

    def _attrs(self, out: dict[str, dict[str, Any]]) -> None:
        nv, attrs = self.nv, {}
        if self.reasons_fn is not None:
            try:
                mask = self.reasons_fn()
                attrs["clock_event_reasons"] = tuple(n for bit, n in self.reason_bits if bit and mask & bit)
            except nv.NVMLError:
                pass
        if self.persistence:
            try:
                attrs["persistence_mode"] = (
                    self.call("nvmlDeviceGetPersistenceMode") == nv.NVML_FEATURE_ENABLED
                )
            except nv.NVMLError:
                pass
        if self.pstate:
            try:
                attrs["pstate"] = f"P{self.call('nvmlDeviceGetPerformanceState')}"
            except nv.NVMLError:
                pass
        out[self.id] = attrs
