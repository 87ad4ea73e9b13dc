"""A journaled power limit checked before it is written back (attack6 G3: saved values were written as
found in the journal, whatever they were).

A restore writes the journal's raw value (µW) as root; one that is no positive integer, or lies outside the
limit's constraints, is no original of that knob (a hand-edited or planted journal) and raises
:class:`~aithermd.errors.RefusedOriginal` with a line that says so: nothing is written, the entry stays.
"""

from __future__ import annotations

from typing import Any

from aithermd import units
from aithermd.errors import RefusedOriginal
from aithermd.model import Knob

RAPL_CEILING_UW = 4_095_875_000  # the largest RAPL limit the MSR holds (firmware's "unlimited" PL2)


def checked_uw(knob: Knob, key: str, value: Any, *, bounded: bool = True, top_uw: int | None = None) -> int:
    """``value`` (µW) when it is a positive integer within ``knob``'s min/max (when ``bounded``; W) and at
    most
    ``top_uw``; else raises RefusedOriginal naming ``knob``, ``key`` and why."""
    lo = units.w_to_uw(knob.min) if bounded and knob.min is not None else 1
    hi = units.w_to_uw(knob.max) if bounded and knob.max is not None else top_uw
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        span = f"{lo / 1e6:g}–{hi / 1e6:g} W" if hi is not None else f"at least {lo / 1e6:g} W"
        raise RefusedOriginal(f"{knob.id}: saved {key} {value!r} is outside the limit's constraints "
                              f"({span}): no original of this knob, not written")
    return value
