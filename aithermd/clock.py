"""Clocks, injected everywhere time matters so tests control it."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic clock (never jumps)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch (may jump)."""


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told: ``advance(s)``."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_767_225_600.0) -> None:
        self._t = start
        self._wall_offset = wall_start - start

    def monotonic(self) -> float:
        return self._t

    def wall(self) -> float:
        return self._t + self._wall_offset

    def advance(self, seconds: float) -> None:
        self._t += seconds
