"""The hot path of hwmon sampling: the loop over the input files (:func:`read_inputs`) and fast constructors
for the values a sample builds by the hundred.

A frozen slotted dataclass's ``__init__`` calls ``object.__setattr__`` once per field, which costs more
than the ``pread`` that produced the value. :func:`ok_reading` and :func:`ok_knob` set the slots directly
and build objects equal to ``Reading(channel_id, value)`` and ``KnobValue(knob_id, value, mode)``; if the
model's fields ever change they are the plain constructors (tests/backends compare both).
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Callable, Sequence
from typing import Any

from aithermd.backends.sysfs import READ_SIZE, classify_oserror
from aithermd.model import EMPTY, KnobValue, Reading, Status
from aithermd.units import mc_to_c

_GONE = (errno.ENODEV, errno.ENOENT)


def _fast_constructors() -> tuple[
    Callable[[str, float], Reading], Callable[[str, float, str | None], KnobValue]
]:
    """Constructors for an ok ``Reading(channel_id, value)`` and an ok ``KnobValue(knob_id, value, mode)``
    that set the slots directly, skipping the frozen dataclass ``__init__`` (one ``object.__setattr__`` per
    field: the largest cost of a sample). If either type's fields ever change, the plain constructors."""
    if [f.name for f in dataclasses.fields(Reading)] != ["channel_id", "value", "status", "detail"] or [
        f.name for f in dataclasses.fields(KnobValue)
    ] != ["knob_id", "value", "mode", "status", "extra"]:
        return Reading, KnobValue
    new, ok = object.__new__, Status.OK
    r_id, r_value, r_status, r_detail = (
        getattr(Reading, n).__set__ for n in ("channel_id", "value", "status", "detail")
    )
    k_id, k_value, k_mode, k_status, k_extra = (
        getattr(KnobValue, n).__set__ for n in ("knob_id", "value", "mode", "status", "extra")
    )

    def ok_reading(channel_id: str, value: float) -> Reading:
        r = new(Reading)
        r_id(r, channel_id)
        r_value(r, value)
        r_status(r, ok)
        r_detail(r, None)
        return r

    def ok_knob(knob_id: str, value: float, mode: str | None) -> KnobValue:
        k = new(KnobValue)
        k_id(k, knob_id)
        k_value(k, value)
        k_mode(k, mode)
        k_status(k, ok)
        k_extra(k, EMPTY)
        return k

    return ok_reading, ok_knob


ok_reading, ok_knob = _fast_constructors()
_INLINE = ok_reading is not Reading  # the slots can be set directly (see _fast_constructors)
_r_id, _r_value, _r_status, _r_detail = (
    getattr(Reading, n).__set__ for n in ("channel_id", "value", "status", "detail"))


def read_inputs(backend: Any, inputs: Sequence[Any], readings: dict[str, Reading], gone: dict[str, int],
                nonsense: Callable[[Any, bytes], str]) -> None:
    """Read every input of an hwmon ``backend`` once into ``readings`` (channel id → Reading), counting in
    ``gone`` the ENODEV/ENOENT failures per device. ``inputs``: the backend's inputs (``id``, ``device_id``,
    ``attr``, ``convert``, the plausible range ``lo``…``hi`` less ``gap_lo``…``gap_hi``, and ``raw``/``last``:
    the text of the last good read and its reading); a device in ``backend.skip`` reads stale, the one
    being read is ``backend.reading``; ``nonsense(input, raw)`` says why a value is implausible.

    Per input: one ``pread``; a text equal to the last good one reuses its reading (a frozen value: the
    same verdict), else one ``int()`` and a range check. ``backend.reading`` is set when the pass moves on
    to another device (inputs come device by device), a millidegree value is converted inline and an ok
    reading is built in place (what :func:`ok_reading` does, without its call): at 1 Hz each of these was
    a share of the per-channel cost."""
    skip = backend.skip
    device = backend.reading = None
    new, ok, mc = object.__new__, Status.OK, mc_to_c
    for inp in inputs:
        if skip and inp.device_id in skip:
            readings[inp.id] = Reading(inp.id, None, Status.STALE, skip[inp.device_id])
            continue
        if inp.device_id is not device:
            device = backend.reading = inp.device_id
        attr = inp.attr
        try:
            try:
                raw = attr.pread(attr.fd, READ_SIZE, 0)
            except OSError as first:
                raw = attr.after(first)
            if raw == inp.raw:
                readings[inp.id] = inp.last
                continue
            inp.raw = None
            if raw[-1:] == b"\n":
                convert = inp.convert
                value = int(raw) / 1000.0 if convert is mc else convert(int(raw))
                if inp.lo <= value <= inp.hi and not inp.gap_lo <= value <= inp.gap_hi:
                    if _INLINE:
                        r = new(Reading)
                        _r_id(r, inp.id)
                        _r_value(r, value)
                        _r_status(r, ok)
                        _r_detail(r, None)
                    else:
                        r = ok_reading(inp.id, value)
                    readings[inp.id] = inp.last = r
                    inp.raw = raw
                    continue
        except OSError as exc:
            inp.raw = None
            if exc.errno in _GONE:
                gone[inp.device_id] = gone.get(inp.device_id, 0) + 1
            status, detail = classify_oserror(exc)
            readings[inp.id] = Reading(inp.id, None, status, detail)
            continue
        except ValueError:
            pass
        readings[inp.id] = Reading(inp.id, None, Status.IMPLAUSIBLE, nonsense(inp, raw))
