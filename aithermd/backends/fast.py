"""Fast constructors for the values a sample builds by the hundred (the hot path of hwmon sampling).

A frozen slotted dataclass's ``__init__`` calls ``object.__setattr__`` once per field, which costs more
than the ``pread`` that produced the value. :func:`ok_reading` and :func:`ok_knob` set the slots directly
and build objects equal to ``Reading(channel_id, value)`` and ``KnobValue(knob_id, value, mode)``; if the
model's fields ever change they are the plain constructors (tests/backends compare both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from aithermd.model import EMPTY, KnobValue, Reading, Status


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
