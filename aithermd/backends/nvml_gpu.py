"""One NVIDIA GPU seen through NVML: one read of every channel, knob and attribute it has.

Source of the facts: the NVML API reference (nvml.h), units as in :mod:`aithermd.backends.nvml_probe`,
which decides at discovery what is read here. A failing call gives its reading ``failed`` (or
``not_supported``) with the NVML error name as detail; ``NVML_ERROR_GPU_IS_LOST`` raises :class:`Lost`,
the errors only a new ``nvmlInit`` cures raise :class:`Down`.

``NVML_ERROR_NO_DATA`` answered :data:`NO_DATA_LIMIT` times in a row makes that query *unsupported*: it is
no longer asked every tick (its reading is ``not_supported``, "no data") and is tried again after
:data:`REPROBE_S`. A pre-Volta GPU's estimated energy (J) is its power integrated over the reads
(trapezoids; a gap over :data:`MAX_ESTIMATE_GAP_S`, a lost GPU's, adds nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aithermd import units
from aithermd.backends import nvml_acoustic
from aithermd.backends.nvml_probe import _ROLE_CHANNEL, PLAUSIBLE, Down, GpuProbe, Lost, error_names
from aithermd.model import KnobValue, Reading, Status

__all__ = ["Down", "GpuReader", "Lost", "error_names"]

NO_DATA = 21  # nvml.h NVML_ERROR_NO_DATA
NO_DATA_LIMIT = 3
REPROBE_S = 3600.0
MAX_ESTIMATE_GAP_S = 30.0


class GpuReader(GpuProbe):
    """GPU ``index`` (NVML enumeration order) behind ``handle``; device id ``gpu<index>``; call
    :meth:`probe` once, then :meth:`read` every tick."""

    def read(
        self,
        readings: dict[str, Reading],
        knobs: dict[str, KnobValue],
        attrs: dict[str, dict[str, Any]],
        now: float = 0.0,
    ) -> None:
        """Read every channel, knob and attribute of this GPU into the given dicts at monotonic time
        ``now`` (s); raises :class:`Lost` or :class:`Down`."""
        nv = self.nv
        raw: dict[str, Any] = {}
        failed: dict[str, str] = {}
        skip = self.unsupported
        if skip:
            for role in [r for r, t in skip.items() if now >= t]:
                del skip[role]  # ask again: it may have data now
            for role in skip:
                failed[role] = "NVML_ERROR_NO_DATA: unsupported (asked again hourly)"

        def grab(role: str, fn: Callable[[], Any]) -> None:
            if role in skip:
                return
            try:
                raw[role] = fn()
            except nv.NVMLError as exc:
                failed[role] = self._detail(exc)

        fields = [(r, f) for r, f in self.fields if r not in skip] if skip else self.fields
        if fields:
            try:
                values = self.call("nvmlDeviceGetFieldValues", [fid for _, fid in fields])
                for (role, _), v in zip(fields, values, strict=True):
                    if v.nvmlReturn == nv.NVML_SUCCESS:
                        raw[role] = (
                            v.value.ullVal
                            if v.valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                            else v.value.uiVal
                        )
                    else:
                        failed[role] = self.names.get(v.nvmlReturn, f"NVML_ERROR_{v.nvmlReturn}")
            except nv.NVMLError as exc:
                failed.update((role, self._detail(exc)) for role, _ in fields)
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
        self._count_no_data(raw, failed, now)
        self._readings(raw, failed, readings)
        if self.estimate_energy:
            self._estimate(readings, now)
        self._knob_values(raw, failed, knobs)
        self._attrs(attrs)
        self.extra.read(self, readings)

    def _count_no_data(self, raw: dict[str, Any], failed: dict[str, str], now: float) -> None:
        counts = self._no_data
        for role in raw:
            counts.pop(role, None)
        for role, detail in failed.items():
            if detail != "NVML_ERROR_NO_DATA":
                continue
            counts[role] = counts.get(role, 0) + 1
            if counts[role] >= NO_DATA_LIMIT:
                del counts[role]
                self.unsupported[role] = now + REPROBE_S
                failed[role] = "NVML_ERROR_NO_DATA: unsupported (asked again hourly)"

    def _estimate(self, readings: dict[str, Reading], now: float) -> None:
        """The estimated energy channel: power integrated over time (J)."""
        power = readings.get(f"{self.id}/power")
        watts = power.value if power is not None and power.status is Status.OK else None
        t0, w0, joules = self._est if self._est is not None else (now, watts, 0.0)
        if watts is not None and w0 is not None and 0.0 < now - t0 <= MAX_ESTIMATE_GAP_S:
            joules += 0.5 * (w0 + watts) * (now - t0)
        self._est = (now, watts, joules)
        cid = f"{self.id}/energy"
        readings[cid] = Reading(cid, joules)

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
                status = (
                    Status.NOT_SUPPORTED
                    if detail == "NVML_ERROR_NOT_SUPPORTED" or attribute in self.unsupported
                    or (attribute in ("utilization", "memory_utilization") and "util" in self.unsupported)
                    else Status.FAILED
                )
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
        if nvml_acoustic.ATTR in self.knobs:
            out[f"{self.id}/{nvml_acoustic.ATTR}"] = nvml_acoustic.value(self)
        if self.extra.knob is not None:
            out[self.extra.knob.id] = self.extra.value("sm_clock" not in failed)

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
