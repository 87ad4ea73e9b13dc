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
from functools import partial
from typing import Any

from aithermd import units
from aithermd.backends import nvml_acoustic
from aithermd.backends.energy_rate import ceiling_w
from aithermd.backends.nvml_probe import _ROLE_CHANNEL, PLAUSIBLE, Down, GpuProbe, Lost, error_names
from aithermd.model import Device, KnobValue, Reading, Status

__all__ = ["Down", "GpuReader", "Lost", "error_names"]

NO_DATA = 21  # nvml.h NVML_ERROR_NO_DATA
NO_DATA_LIMIT = 3
REPROBE_S = 3600.0
MAX_ESTIMATE_GAP_S = 30.0
PERSISTENCE_EVERY_S = 30.0  # the persistence mode is asked again after this long (s)


class GpuReader(GpuProbe):
    """GPU ``index`` (NVML enumeration order) behind ``handle``; device id ``gpu<index>``; call
    :meth:`probe` once, then :meth:`read` every tick."""

    _plan: list[tuple[str, Callable[[], Any]]] | None = None  # (role, call) of each tick, made once
    _convert: dict[str, tuple[Callable[[Any], float], float, float]] | None = None  # channel attribute →
    _last: dict[str, Reading] | None = None  # (convert, lo, hi); the readings of the previous read
    _reasons: dict[int, tuple[str, ...]] | None = None  # clocks-event mask → names
    _persistence: tuple[float, bool] | None = None  # (monotonic s of the read, persistence mode)
    temp_raw: tuple[str, tuple[Any, ...]] | None = None  # (NVML function, args) temp_fn calls (probe)

    def probe(self) -> Device:
        """:meth:`GpuProbe.probe`; what :meth:`read` asks each tick is then worked out again."""
        self._plan = self._convert = self._last = self._reasons = self._persistence = None
        return super().probe()

    def _tick_plan(self) -> list[tuple[str, Callable[[], Any]]]:
        """The single calls of each tick after the field values, as (role, call) in order."""
        call, nv = self.call, self.nv
        plan = list(self.calls.items())
        if self.temp_fn is not None:
            plan.append(("temperature", self.temp_fn))
        if self.util:
            plan.append(("util", partial(call, "nvmlDeviceGetUtilizationRates")))
        if self.clocks:
            plan.append(("sm_clock", partial(call, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)))
            plan.append(("memory_clock", partial(call, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM)))
        for i in self.fans:
            plan.append((f"fan{i}", partial(call, "nvmlDeviceGetFanSpeed") if self.fan_v1
                         else partial(call, "nvmlDeviceGetFanSpeed_v2", i)))
        self._convert = {a: (_ROLE_CHANNEL.get(a, (None, float))[1], *PLAUSIBLE[ch.quantity])
                         for a, ch in self.channels.items()}
        power = self.channels.get("power")
        if power is not None:  # no card draws twice its highest limit (attack8 T7: a 10× sample was taken)
            limit = self.knobs.get("power_limit")
            fn, lo, hi = self._convert["power"]
            self._convert["power"] = (fn, lo, min(hi, ceiling_w(limit.max if limit is not None else None)))
        return plan

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
        plan = self._plan
        if plan is None:
            plan = self._plan = self._tick_plan()
        fields = [(r, f) for r, f in self.fields if r not in skip] if skip else self.fields
        if fields:
            try:
                values = self.call("nvmlDeviceGetFieldValues", [fid for _, fid in fields])
                ok, ull = nv.NVML_SUCCESS, nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                for (role, _), v in zip(fields, values, strict=True):
                    if v.nvmlReturn == ok:
                        raw[role] = v.value.ullVal if v.valueType == ull else v.value.uiVal
                    else:
                        failed[role] = self.names.get(v.nvmlReturn, f"NVML_ERROR_{v.nvmlReturn}")
            except nv.NVMLError as exc:
                failed.update((role, self._detail(exc)) for role, _ in fields)
        error = nv.NVMLError
        for role, fn in plan:
            if role in skip:
                continue
            try:
                raw[role] = fn()
            except error as exc:
                failed[role] = self._detail(exc)
        if failed:
            if self.partial and not raw:  # partial (nvml_reprobe.py), yet every call failed: NVML is down
                raise Down(next(iter(failed.values())))
            self._count_no_data(raw, failed, now)
        elif self._no_data:
            self._no_data.clear()
        self._readings(raw, failed, readings)
        if self.estimate_energy:
            self._estimate(readings, now)
        self._knob_values(raw, failed, knobs)
        self._attrs(attrs, now)
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
        last = self._last if self._last is not None else {}
        self._last = now = {}
        convert = self._convert if self._convert is not None else {}
        for attribute, channel in self.channels.items():
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
            fn, lo, hi = convert.get(attribute) or (float, *PLAUSIBLE[channel.quantity])
            value = fn(value)
            if lo <= value <= hi:
                prev = last.get(attribute)  # an unchanged value keeps its Reading: no new object a tick
                now[attribute] = out[channel.id] = prev if prev is not None and prev.value == value \
                    else Reading(channel.id, value)
            else:
                out[channel.id] = Reading(channel.id, None, Status.IMPLAUSIBLE,
                                          f"{value:g} {channel.unit} out of range")

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

    def _attrs(self, out: dict[str, dict[str, Any]], now: float = 0.0) -> None:
        """Clocks-event reasons and P-state every tick; the persistence mode every
        :data:`PERSISTENCE_EVERY_S` (it changes only when an administrator sets it)."""
        nv, attrs = self.nv, {}
        if self.reasons_fn is not None:
            try:
                mask = self.reasons_fn()
                names = self._reasons if self._reasons is not None else {}
                self._reasons = names
                if mask not in names:
                    names[mask] = tuple(n for bit, n in self.reason_bits if bit and mask & bit)
                attrs["clock_event_reasons"] = names[mask]
            except nv.NVMLError:
                pass
        if self.persistence:
            kept = self._persistence
            if kept is not None and 0.0 <= now - kept[0] < PERSISTENCE_EVERY_S:
                attrs["persistence_mode"] = kept[1]
            else:
                try:
                    enabled = self.call("nvmlDeviceGetPersistenceMode") == nv.NVML_FEATURE_ENABLED
                    self._persistence = (now, enabled)
                    attrs["persistence_mode"] = enabled
                except nv.NVMLError:
                    self._persistence = None
        if self.pstate:
            try:
                attrs["pstate"] = f"P{self.call('nvmlDeviceGetPerformanceState')}"
            except nv.NVMLError:
                pass
        out[self.id] = attrs
