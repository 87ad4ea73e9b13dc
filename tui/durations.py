"""Durations and values as people type them on a command line: ``90``, ``90s``, ``15m``, ``2h``, ``250W``,
``1500MHz``."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_FACTORS = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_VALUE = re.compile(r"^\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*(w|%|°c|c|mhz)?\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a bare number is seconds; suffixes ``s``, ``m``, ``h``, ``d``.

    Raises ValueError with a readable message (argparse shows it) for anything else, and for zero.
    """
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (examples: 90, 90s, 15m, 2h)")
    seconds = float(match.group(1)) * _FACTORS[(match.group(2) or "").lower() or None]
    if seconds <= 0 or math.isinf(seconds):
        raise ValueError(f"a duration must be more than zero: {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``3725`` → ``"1h 2m"``; ``95`` → ``"1m 35s"``; ``4.2`` → ``"4.2s"``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {(s % 3600) // 60:02d}m"


def parse_value(text: str) -> float:
    """A knob value in daemon units: ``250``, ``250W``, ``60%``, ``1500MHz`` (a locked SM clock). The unit, when given, is only checked for
    form here; :func:`check_unit` checks it against the knob (the daemon gets the number only). Raises
    ValueError."""
    match = _VALUE.match(text)
    if not match:
        raise ValueError(f"not a value: {text!r} (examples: 250, 250W, 60%, 1500MHz)")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise ValueError(f"not a finite value: {text!r}")
    if value < 0:  # W, %, MHz: no knob takes a negative value
        raise ValueError(f"a negative value: {text!r} (a knob's value is 0 or more: 250, 250W, 60%, 1500MHz)")
    return value


_UNITS = {"w": "W", "%": "%", "°c": "°C", "c": "°C", "mhz": "MHz"}


def check_unit(text: str, unit: str | None) -> None:
    """Raise ValueError when ``text`` (as :func:`parse_value` takes it) names a unit other than the knob's
    ``unit``: SetOverride carries the number only, so ``80%`` for a power limit would set 80 W."""
    match = _VALUE.match(text)
    given = _UNITS.get((match.group(2) or "").lower()) if match else None
    if given and unit and given != unit:
        raise ValueError(f"{text.strip()!r} is in {given}, but this knob is set in {unit}: give a value in "
                         f"{unit}")
