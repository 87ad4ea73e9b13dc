"""The NVML backend's knobs: power limit (W ↔ mW), fan duty (%) and the locked SM clock's top (MHz,
:mod:`aithermd.backends.nvml_clocks`), their originals and their restore.

A mixin of :class:`~aithermd.backends.nvml.NvmlBackend` (which provides ``nvml``, ``life``, ``worker``,
``clock``, ``_names`` and ``_log``). Every call runs on the NVML worker under the GPU's deadline; a GPU
that is lost, down or hung refuses at once. ``NVML_ERROR_NO_PERMISSION`` on a write (as root: a container
without CAP_SYS_ADMIN) makes the knob read-only with that reason, once: it is not tried again, and the
runtime learns of it through ``take_changes()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from aithermd import units
from aithermd.backends import nvml_acoustic
from aithermd.backends.nvml_clocks import KNOB
from aithermd.backends.nvml_gpu import Down, Lost
from aithermd.backends.nvml_life import Slot
from aithermd.errors import (
    BackendError,
    BackendTimeout,
    DeviceLost,
    NoPermission,
    NotSupported,
    OutOfRange,
    UnknownKnob,
)
from aithermd.model import KnobValue, Status

NO_PERMISSION_WHY = ("NVML_ERROR_NO_PERMISSION: NVML refused the write although the daemon runs as root "
                     "(a container without CAP_SYS_ADMIN, or the GPU's settings are locked)")


class NvmlKnobs:
    """Knob calls of the NVML backend (see the module doc)."""

    nvml: Any
    life: Any
    worker: Any
    clock: Any
    _names: dict[int, str]
    _log: Any

    def _knob(self, knob_id: str) -> tuple[Slot, str]:
        dev_id, _, attr = knob_id.partition("/")
        slot = self.life.slots.get(dev_id)
        if slot is None or attr not in slot.reader.knobs:
            raise UnknownKnob(knob_id)
        if slot.state != "ok":
            raise DeviceLost(f"{knob_id}: {dev_id} is {slot.state} ({slot.why})")
        return slot, attr

    def _on(self, knob_id: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(knob_id, *args)`` on the worker under the GPU's deadline."""
        return self.worker.run(fn, knob_id, *args, gpu=knob_id.partition("/")[0])

    def _do(self, slot: Slot, what: str, fname: str, *args: Any) -> Any:
        nv = self.nvml
        try:
            return slot.reader.call(fname, *args)
        except (Lost, Down) as exc:
            self.life.lose(slot, exc, self.clock.monotonic())
            why = self.life.name(exc) if isinstance(exc, Down) else "NVML_ERROR_GPU_IS_LOST"
            raise DeviceLost(f"{what}: {why}") from exc
        except nv.NVMLError as exc:
            name, code = self._names.get(exc.value, str(exc.value)), exc.value
            cls = {
                nv.NVML_ERROR_INVALID_ARGUMENT: OutOfRange,
                nv.NVML_ERROR_NO_PERMISSION: NoPermission,
                nv.NVML_ERROR_NOT_SUPPORTED: NotSupported,
                nv.NVML_ERROR_FUNCTION_NOT_FOUND: NotSupported,
                nv.NVML_ERROR_TIMEOUT: BackendTimeout,
            }.get(code, BackendError)
            raise cls(f"{what}: {name}") from exc

    def write_knob(self, knob_id: str, value: float) -> None:
        """Power limit in W (→ mW, within the limit constraints), target temperature in °C (NVML's acoustic
        threshold: :mod:`aithermd.backends.nvml_acoustic`), fan duty in % (switches the fan to manual), or
        the top of a locked SM clock range in MHz (the card's top clock: unlocked). Raises OutOfRange,
        NoPermission (the knob is then read-only: :meth:`take_changes`), NotSupported, DeviceLost,
        BackendTimeout, BackendError, UnknownKnob."""
        self._on(knob_id, self._write, value)

    def _write(self, knob_id: str, value: float) -> None:
        slot, attr = self._knob(knob_id)
        knob = slot.reader.knobs[attr]
        if not knob.writable:
            raise (NoPermission if "NO_PERMISSION" in (knob.why_not or "") else NotSupported)(
                f"{knob_id}: {knob.why_not}"
            )
        unit = knob.unit
        if (
            value is None
            or math.isnan(value)
            or (knob.min is not None and value < knob.min)
            or (knob.max is not None and value > knob.max)
        ):
            raise OutOfRange(
                f"{knob_id}: {value} {unit} outside {knob.min:g}–{knob.max:g} {unit}"
                if knob.min is not None and knob.max is not None
                else f"{knob_id}: {value} {unit}"
            )
        try:
            if attr == "power_limit":
                self._do(slot, f"{knob_id} := {value:g} W", "nvmlDeviceSetPowerManagementLimit",
                         units.w_to_mw(value))
            elif attr == nvml_acoustic.ATTR:
                self._do(slot, f"{knob_id} := {value:g} °C", *nvml_acoustic.set_args(slot.reader, value))
            elif attr == KNOB:
                slot.reader.extra.write(lambda what, f, *a: self._do(slot, what, f, *a), value)
            else:
                self._do(slot, f"{knob_id} := {value:g} %", "nvmlDeviceSetFanSpeed_v2", int(attr[3:]),
                         round(value))
        except NoPermission:
            self.life.deny(slot, attr, NO_PERMISSION_WHY)
            self._log.error("knob_read_only", knob=knob_id, reason=NO_PERMISSION_WHY)
            raise

    def set_fan_auto(self, knob_id: str) -> None:
        """Hand fan ``knob_id`` back to the driver's automatic curve (nvmlDeviceSetDefaultFanSpeed_v2)."""
        self._on(knob_id, self._fan_auto)

    def _fan_auto(self, knob_id: str) -> None:
        slot, attr = self._knob(knob_id)
        if not attr.startswith("fan"):
            raise UnknownKnob(f"{knob_id} is not a fan")
        self._do(slot, f"{knob_id} := auto", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))

    def read_knob(self, knob_id: str) -> KnobValue:
        return self._on(knob_id, self._read_knob)

    def _read_knob(self, knob_id: str) -> KnobValue:
        try:
            slot, attr = self._knob(knob_id)
        except DeviceLost:
            return KnobValue(knob_id, None, None, Status.FAILED)
        reader, nv = slot.reader, self.nvml
        try:
            if attr.startswith("fan"):
                return reader.fan_value(int(attr[3:]))
            if attr == nvml_acoustic.ATTR:
                return nvml_acoustic.value(reader)
            if attr == KNOB:
                reader.call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)  # does the GPU answer?
                return reader.extra.value()
            limit = reader.call("nvmlDeviceGetPowerManagementLimit")
            enforced, _ = reader.attempt("nvmlDeviceGetEnforcedPowerLimit")
        except (Lost, Down) as exc:
            self.life.lose(slot, exc, self.clock.monotonic())
            return KnobValue(knob_id, None, None, Status.FAILED)
        except nv.NVMLError:
            return KnobValue(knob_id, None, None, Status.FAILED)
        extra = {} if enforced is None else {"enforced_w": units.mw_to_w(enforced)}
        return KnobValue(knob_id, units.mw_to_w(limit), None, Status.OK, extra)

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """Power limit: ``{"limit_mw": int, "uuid"}``; target temperature ``{"target_c": int, "uuid"}``; fan:
        ``{"speed_pct": int, "mode": "auto"|"manual"|None, "uuid"}``. The GPU's UUID binds the original to
        that board: after a crash the NVML index of a GPU can change (one removed, a reordered bus), the UUID
        does not."""
        return self._on(knob_id, self._save)

    def _save(self, knob_id: str) -> dict[str, Any]:
        slot, attr = self._knob(knob_id)
        if attr == "power_limit":
            limit = self._do(slot, f"{knob_id}: read original", "nvmlDeviceGetPowerManagementLimit")
            return {"limit_mw": int(limit), "uuid": slot.reader.uuid}
        if attr == nvml_acoustic.ATTR:
            kv = nvml_acoustic.value(slot.reader)
            if kv.value is None:
                raise BackendError(f"{knob_id}: cannot read the original target temperature")
            return {"target_c": int(kv.value), "uuid": slot.reader.uuid}
        if attr == KNOB:  # NVML cannot read a lock back: the original is what this process knows
            return {**slot.reader.extra.save(), "uuid": slot.reader.uuid}
        kv = slot.reader.fan_value(int(attr[3:]))
        if kv.value is None:
            raise BackendError(f"{knob_id}: cannot read the original fan state")
        return {"speed_pct": int(round(kv.value)), "mode": kv.mode, "uuid": slot.reader.uuid}

    def _saved_slot(self, knob_id: str, saved: dict[str, Any]) -> tuple[Slot, str]:
        """The GPU the original was saved from: by its UUID when the journal has one (the index in the knob
        id may now name another board); raises UnknownKnob when that GPU is not here."""
        uuid = saved.get("uuid")
        here = self.life.slots.get(knob_id.partition("/")[0])
        if uuid is None or (here is not None and here.reader.uuid == uuid):
            return self._knob(knob_id)  # an older journal without a UUID, or the same board at the index
        attr = knob_id.partition("/")[2]
        for other in self.life.slots.values():
            if other.reader.uuid == uuid and attr in other.reader.knobs:
                return self._knob(f"{other.id}/{attr}")
        raise UnknownKnob(f"{knob_id}: GPU {uuid} is not here (its NVML index now names another board)")

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        """Put back what :meth:`save_knob` returned; a fan that was automatic goes back to automatic."""
        self._on(knob_id, self._restore, saved)

    def _restore(self, knob_id: str, saved: dict[str, Any]) -> None:
        here = self.life.slots.get(knob_id.partition("/")[0])
        if here is not None:  # lost or down: asked again now, not after its backoff (the stop cannot wait)
            self.life.recheck(here, self.clock.monotonic())
        slot, attr = self._saved_slot(knob_id, saved)
        if attr == KNOB:
            slot.reader.extra.restore(lambda what, f, *a: self._do(slot, what, f, *a), saved)
        elif attr == "power_limit":
            self._do(slot, f"{knob_id}: restore {saved['limit_mw']} mW", "nvmlDeviceSetPowerManagementLimit",
                     int(saved["limit_mw"]))
        elif attr == nvml_acoustic.ATTR:
            self._do(slot, f"{knob_id}: restore {saved['target_c']} °C",
                     *nvml_acoustic.set_args(slot.reader, saved["target_c"]))
        elif saved.get("mode") == "manual" or (saved.get("mode") is None and not slot.reader.fan_policy):
            self._do(slot, f"{knob_id}: restore {saved['speed_pct']} %", "nvmlDeviceSetFanSpeed_v2",
                     int(attr[3:]), int(saved["speed_pct"]))
        else:
            self._do(slot, f"{knob_id}: restore auto", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))

