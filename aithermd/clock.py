"""Clocks, injected everywhere time matters so tests control it."""

from __future__ import annotations

import time
from functools import partial
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic clock (never jumps)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch (may jump)."""

    def boottime(self) -> float:
        """Seconds on the boot clock: monotonic, and counting the time the machine slept (CLOCK_BOOTTIME)."""


class RealClock:
    """The machine's clocks: :func:`time.monotonic`, :func:`time.time` and ``CLOCK_BOOTTIME``, called as they
    are (no Python function around each: the daemon reads the clock some 15 times a tick)."""

    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)
    boottime = staticmethod(partial(time.clock_gettime, time.CLOCK_BOOTTIME))


class FakeClock:
    """A clock that moves only when told: ``advance(s)`` moves monotonic and wall time together, never
    backwards; ``step_wall(s)`` steps the wall clock alone. Monotonic time starts at ``start`` s, wall time at ``wall_start`` (default 2026-01-01 00:00
    UTC). The simulated workstation's clock (:class:`aithermd.sim.runner.SimClock`) and the tests' clock
    are this one."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_767_225_600.0) -> None:
        self._t = start
        self._wall_offset = wall_start - start
        self._slept = 0.0

    def monotonic(self) -> float:
        return self._t

    def wall(self) -> float:
        return self._t + self._wall_offset

    def boottime(self) -> float:
        return self._t + self._slept

    def suspend(self, seconds: float) -> None:
        """The machine sleeps ``seconds``: wall and boot time move, monotonic time does not."""
        if seconds > 0:
            self._slept += seconds
            self._wall_offset += seconds

    def step_wall(self, seconds: float) -> None:
        """NTP (timesyncd, chrony) steps the wall clock by ``seconds`` (either way): monotonic and boot time
        do not move."""
        self._wall_offset += seconds

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._t += seconds
