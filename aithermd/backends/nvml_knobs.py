"""The NVML backend's knobs: power limit (W ↔ mW), fan duty (%) and the locked SM clock's top (MHz,
:mod:`aithermd.backends.nvml_clocks`), their originals and their restore.

A mixin of :class:`~aithermd.backends.nvml.NvmlBackend` (which provides ``nvml``, ``life``, ``worker``,
``clock``, ``_names`` and ``_log``). Every call runs on the NVML worker under the GPU's deadline; a GPU
that is lost, down or hung refuses at once. ``NVML_ERROR_NO_PERMISSION`` on a write of a knob that never took
one (as root: a container without CAP_SYS_ADMIN) makes the knob read-only with that reason (the runtime
learns of it through ``take_changes()``); a write asked of it later is still made (the applier asks only a
safety decision's, with backoff), and one that goes through makes it writable again. The same answer from
a knob that took writes before is a refusal of that moment, not a capability (attack4 B5): the knob stays
writable and is tried again whenever asked (``knob_write_refused``, said once, until ``knob_write_back``).

Any other failed write (``NVML_ERROR_UNKNOWN`` from one set call broken on one board or driver branch, a
``TIMEOUT``) is a fault of that knob, not of the GPU (its reads go on; see
:mod:`aithermd.backends.nvml_probe`): said once (``knob_write_failed``), the knob's writes are then refused
without an NVML call and tried again with backoff (:data:`WRITE_BACKOFF_S`), until one succeeds
(``knob_write_back``); a different value (a safety cut after a policy value failed) is tried at once. The restore at the stop is tried whatever the GPU's or the knob's state, each knob on
its own: a write that fails leaves the knob restored when it reads back as its original, and a fan whose
manual duty cannot be put back is handed to the driver's automatic curve instead (the restore's note).
A power limit the driver refuses inside its constraints (INVALID_ARGUMENT) is
:mod:`aithermd.backends.nvml_floor`'s: as deep as the driver takes, a floor kept for a while only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aithermd import units
from aithermd.backends import nvml_acoustic
from aithermd.backends.base import LOW_DUTY_PCT, TO_WRITER
from aithermd.backends.nvml_clocks import KNOB
from aithermd.backends.nvml_floor import LimitWrites
from aithermd.backends.nvml_gpu import Down, Lost
from aithermd.backends.nvml_life import Slot
from aithermd.errors import (
    BackendError,
    BackendTimeout,
    DeviceLost,
    NoPermission,
    NotSupported,
    OutOfRange,
    RefusedOriginal,
    UnknownKnob,
)
from aithermd.model import KnobValue, Status

SET_LIMIT = "nvmlDeviceSetPowerManagementLimit"
DEFAULT_LIMIT = "nvmlDeviceGetPowerManagementDefaultLimit"


def _kept(speed: Any) -> bool:
    """Whether a manual fan speed (%) found at the first write is put back as it is: a number from
    :data:`~aithermd.backends.base.LOW_DUTY_PCT` to 100 (below it nothing would drive the fan once the daemon
    is gone; anything else does not decode)."""
    return isinstance(speed, int | float) and not isinstance(speed, bool) and LOW_DUTY_PCT <= speed <= 100
WRITE_BACKOFF_S = (2.0, 60.0)  # a knob whose writes fail: tried again 2 s later, doubling up to 60 s apart
NO_PERMISSION_WHY = ("NVML_ERROR_NO_PERMISSION: NVML refused the write although the daemon runs as root "
                     "(a container without CAP_SYS_ADMIN, or the GPU's settings are locked)")


class NvmlKnobs(LimitWrites):
    """Knob calls of the NVML backend (see the module doc)."""

    nvml: Any
    life: Any
    worker: Any
    clock: Any
    _names: dict[int, str]
    _log: Any

    def _knob(self, knob_id: str, any_state: bool = False) -> tuple[Slot, str]:
        dev_id, _, attr = knob_id.partition("/")
        slot = self.life.slots.get(dev_id)
        if slot is None or attr not in slot.reader.knobs:
            raise UnknownKnob(knob_id)
        if slot.state != "ok" and not any_state:
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
        NoPermission (read-only then, unless it took writes before: see the module doc), NotSupported,
        DeviceLost, BackendTimeout, BackendError, UnknownKnob."""
        self._on(knob_id, self._write, value)

    def _write(self, knob_id: str, value: float) -> None:
        # knob id → [why, next try at, delay, the value that failed]; another value (a safety cut after a
        # policy value failed) is tried at once: only the same request waits for its backoff
        faults: dict[str, list[Any]] = self.__dict__.setdefault("_write_faults", {})
        fault, now = faults.get(knob_id), self.clock.monotonic()
        if fault is not None and now < fault[1] and value == fault[3]:
            raise BackendError(fault[0])  # the same words as the write that failed: reported once
        try:
            self._write_now(knob_id, value)
        except BackendError as exc:
            if type(exc) not in (BackendError, BackendTimeout):
                raise  # out of range, read-only, not supported, lost: not a write that failed
            delay = WRITE_BACKOFF_S[0] if fault is None else min(fault[2] * 2, WRITE_BACKOFF_S[1])
            why = f"{knob_id}: writes fail with {str(exc).rpartition(': ')[2] or type(exc).__name__}; " \
                  f"tried again with backoff (up to {WRITE_BACKOFF_S[1]:g} s)"
            if fault is None or fault[0] != why:
                self._log.error("knob_write_failed", knob=knob_id, value=value, error=str(exc), message=why)
            faults[knob_id] = [why, now + delay, delay, value]
            raise BackendError(why) from exc
        if faults.pop(knob_id, None) is not None:
            self._log.warning("knob_write_back", knob=knob_id, value=value)

    def _write_now(self, knob_id: str, value: float) -> None:
        slot, attr = self._knob(knob_id)
        knob = slot.reader.knobs[attr]
        denied = not knob.writable and "NO_PERMISSION" in (knob.why_not or "")  # tried: it may take it now
        if not knob.writable and not denied:
            raise NotSupported(f"{knob_id}: {knob.why_not}")
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
                self._set_limit(slot, knob_id, value)
            elif attr == nvml_acoustic.ATTR:
                self._do(slot, f"{knob_id} := {value:g} °C", *nvml_acoustic.set_args(slot.reader, value))
            elif attr == KNOB:
                slot.reader.extra.write(lambda what, f, *a: self._do(slot, what, f, *a), value)
            else:
                self._do(slot, f"{knob_id} := {value:g} %", "nvmlDeviceSetFanSpeed_v2", int(attr[3:]),
                         round(value))
        except NoPermission as exc:
            took: set[str] = self.__dict__.setdefault("_took", set())  # knobs that took a write
            refused: set[str] = self.__dict__.setdefault("_refused", set())  # ... and refuse them now
            if knob_id in took:
                if knob_id not in refused:
                    refused.add(knob_id)
                    self._log.error("knob_write_refused", knob=knob_id, value=value, error=str(exc),
                                    message=f"{knob_id}: NVML_ERROR_NO_PERMISSION although it took writes "
                                            "before: refused for now, not read-only; tried again when asked")
            elif not denied:
                self.life.deny(slot, attr, NO_PERMISSION_WHY)
                self._log.error("knob_read_only", knob=knob_id, reason=NO_PERMISSION_WHY)
            raise
        self.__dict__.setdefault("_took", set()).add(knob_id)
        if denied:
            self.life.deny(slot, attr, None)
            self._log.warning("knob_writable_again", knob=knob_id, value=value,
                              message=f"{knob_id} took a write after NVML_ERROR_NO_PERMISSION: writable")
        elif knob_id in self.__dict__.get("_refused", ()):
            self.__dict__["_refused"].discard(knob_id)
            self._log.warning("knob_write_back", knob=knob_id, value=value)

    def _reread_limits(self, slot: Slot, knob_id: str) -> bool:
        """Read the power limit's constraints and default again (a refused value inside those known: a driver
        reloaded with another VBIOS, a 12VHPWR cable's sense pins; attack4 B2). True when they changed: the
        knob then holds the new ones (the runtime rediscovers it: :meth:`take_changes`) and it is said."""
        knob, reader, n = slot.reader.knobs["power_limit"], slot.reader, units.num
        bounds, code = reader.attempt("nvmlDeviceGetPowerManagementLimitConstraints")
        default, _ = reader.attempt("nvmlDeviceGetPowerManagementDefaultLimit")
        if code is not None:
            return False  # unreadable now: the refusal stands as it is
        new = (units.mw_to_w(bounds[0]), units.mw_to_w(bounds[1]),
               knob.default if default is None else units.mw_to_w(default))
        if new == (knob.min, knob.max, knob.default):
            return False
        reader.knobs["power_limit"] = replace(knob, min=new[0], max=new[1], default=new[2])
        slot.device = replace(slot.device, knobs=tuple(reader.knobs.values()))
        self.life.changed = True
        self._log.warning("power_limit_constraints_changed", knob=knob_id,
                          was=[knob.min, knob.max, knob.default], now=list(new),
                          message=f"{knob_id}: the driver's limits changed under the daemon: {n(knob.min)}–"
                                  f"{n(knob.max)} W (default {n(knob.default)} W) → {n(new[0])}–{n(new[1])} W "
                                  f"(default {n(new[2])} W); clamped to them from now on")
        return True

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
        """Power limit: ``{"limit_mw": int, "uuid"}``, plus ``"unread"`` (why) when the limit could not be
        read and the driver's default limit (the stock state) stands in; target temperature
        ``{"target_c": int, "uuid"}``; fan:
        ``{"speed_pct": int, "mode": "auto"|"manual"|None, "uuid"}``. The GPU's UUID binds the original to
        that board: after a crash the NVML index of a GPU can change (one removed, a reordered bus), the UUID
        does not."""
        return self._on(knob_id, self._save)

    def _save(self, knob_id: str) -> dict[str, Any]:
        slot, attr = self._knob(knob_id)
        if attr == "power_limit":
            try:
                limit = self._do(slot, f"{knob_id}: read original", "nvmlDeviceGetPowerManagementLimit")
            except NotSupported as exc:  # unreadable before the first write (nvsafe8; not a slow GPU): the
                try:  # driver's default stands in, marked: a safety cut is written, the restore sets stock
                    limit = self._do(slot, f"{knob_id}: read default", DEFAULT_LIMIT)
                except BackendError:
                    raise exc from None
                return {"limit_mw": int(limit), "uuid": slot.reader.uuid, "unread": str(exc)}
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

    def _saved_slot(self, knob_id: str, saved: dict[str, Any], any_state: bool = False) -> tuple[Slot, str]:
        """The GPU the original was saved from: by its UUID when the journal has one (the index in the knob
        id may now name another board); raises UnknownKnob when that GPU is not here."""
        uuid = saved.get("uuid")
        here = self.life.slots.get(knob_id.partition("/")[0])
        if uuid is None or (here is not None and here.reader.uuid == uuid):
            return self._knob(knob_id, any_state)  # an older journal without a UUID, or the same board
        attr = knob_id.partition("/")[2]
        for other in self.life.slots.values():
            if other.reader.uuid == uuid and attr in other.reader.knobs:
                return self._knob(f"{other.id}/{attr}", any_state)
        raise UnknownKnob(f"{knob_id}: GPU {uuid} is not here (its NVML index now names another board)")

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> str | None:
        """Put back what :meth:`save_knob` returned; a fan that was automatic goes back to automatic. Tried
        whatever the GPU's state (see the module doc); returns a note when the knob was left safe instead
        of as found (a manual fan handed to the driver's curve). Raises DeviceLost, BackendError,
        BackendTimeout, UnknownKnob. Tried too on a GPU held hung only by the read guard (a read that
        overran its budget: a slow GPU answers, slowly), under the worker's deadline."""
        return self.worker.run(self._restore, knob_id, saved, gpu=knob_id.partition("/")[0], held_too=True)

    def _restore(self, knob_id: str, saved: dict[str, Any]) -> str | None:
        here = self.life.slots.get(knob_id.partition("/")[0])
        if here is not None:  # lost or down: asked again now, not after its backoff (the stop cannot wait)
            self.life.recheck(here, self.clock.monotonic())
        slot, attr = self._saved_slot(knob_id, saved, any_state=True)  # down still: the call is tried

        def do(what: str, fname: str, *args: Any) -> Any:
            return self._do(slot, f"{knob_id}: {what}", fname, *args)

        manual = attr.startswith("fan") and (
            saved.get("mode") == "manual" or (saved.get("mode") is None and not slot.reader.fan_policy))
        low = manual and not (saved.get(TO_WRITER) or _kept(saved.get("speed_pct")))
        mw = saved.get("limit_mw")
        if attr == "power_limit" and (isinstance(mw, bool) or not isinstance(mw, int) or mw <= 0):
            raise RefusedOriginal(f"{knob_id}: saved limit_mw {mw!r} is no power limit: not written")  # G3
        try:
            if attr == KNOB:
                slot.reader.extra.restore(lambda what, f, *a: self._do(slot, what, f, *a), saved)
            elif attr == "power_limit":
                note = self._restore_limit(slot, knob_id, saved["limit_mw"])
                if saved.get("unread"):  # the default stood in for an original that could not be read
                    said = f"the driver's default limit set (the original was unreadable: {saved['unread']})"
                    note = f"{said}; {note}" if note else said
                return note
            elif attr == nvml_acoustic.ATTR:
                do(f"restore {saved['target_c']} °C", *nvml_acoustic.set_args(slot.reader, saved["target_c"]))
            elif low:  # nothing would drive it at that speed, or it does not decode: the driver's curve
                do("auto instead", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))
                return (f"{knob_id}: found in manual mode at {saved.get('speed_pct')!r} %, which nothing "
                        "would drive once the daemon is gone: handed to the driver's automatic curve")
            elif manual:
                do(f"restore {saved['speed_pct']} %", "nvmlDeviceSetFanSpeed_v2", int(attr[3:]),
                   int(saved["speed_pct"]))
            else:
                do("restore auto", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))
        except BackendError as exc:
            if slot.state != "ok":  # tried on a GPU lost or down, and failed: said as before
                raise DeviceLost(f"{knob_id}: {slot.id} is {slot.state} ({slot.why})") from exc
            if isinstance(exc, DeviceLost):
                raise
            if not low and self._in_place(slot, attr, saved, manual):
                return None  # the write failed, but the knob holds its original: nothing to put back
            if low:  # never left at that low speed: full speed, else the restore fails (attack7 H6)
                do("full instead", "nvmlDeviceSetFanSpeed_v2", int(attr[3:]), 100)
                return f"{exc}; left at 100 % instead of {saved.get('speed_pct')!r} % manual"
            if not manual:
                raise
            try:  # safe instead of as found: the driver's own curve
                do("auto instead", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))
            except BackendError:
                raise exc from None
            return f"{exc}; handed to the driver's automatic curve instead of {saved['speed_pct']} % manual"
        return None

    def _restore_limit(self, slot: Slot, knob_id: str, mw: int) -> str | None:
        """Put back the original limit ``mw``, clamped into the GPU's constraints now (they may have changed
        since it was saved: a driver reload; the card's own range is never worse than found): a note then."""
        try:
            lo, hi = (int(v) for v in slot.reader.call("nvmlDeviceGetPowerManagementLimitConstraints"))
        except (slot.reader.nv.NVMLError, Lost, Down):
            lo, hi = mw, mw  # unreadable: the original is tried as it is
        to = min(max(mw, lo), hi)
        self._do(slot, f"{knob_id}: restore {to} mW", SET_LIMIT, to)
        return None if to == mw else (
            f"the original {mw / 1000:g} W is outside the GPU's power-limit constraints now ({lo / 1000:g}–"
            f"{hi / 1000:g} W: they changed since it was saved, e.g. a driver reload): {to / 1000:g} W set")

    def _in_place(self, slot: Slot, attr: str, saved: dict[str, Any], manual: bool) -> bool:
        """Whether ``attr`` of ``slot`` reads back as ``saved`` (False when it cannot be read)."""
        reader = slot.reader
        try:
            if attr == "power_limit":
                return int(reader.call("nvmlDeviceGetPowerManagementLimit")) == int(saved["limit_mw"])
            if attr == nvml_acoustic.ATTR:
                return nvml_acoustic.value(reader).value == float(saved["target_c"])
            if attr.startswith("fan"):
                kv = reader.fan_value(int(attr[3:]))
                return kv.mode == ("manual" if manual else "auto") and (
                    not manual or kv.value == float(saved["speed_pct"]))
        except (reader.nv.NVMLError, Lost, Down):
            pass
        return False
