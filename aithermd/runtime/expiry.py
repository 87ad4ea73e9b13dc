"""Expiries that an NTP step of the wall clock neither stretches nor cuts.

A timed override or hold runs out on the boot clock (:meth:`aithermd.clock.Clock.boottime`: monotonic, it
never jumps when timesyncd or chrony step the wall clock, and it counts the time the machine sleeps, as an
operator's "for 15 minutes" does). The wall clock only carries an expiry across a restart, the one span the
boot clock of a new process cannot measure in another boot: saved as the wall time it falls at *now*
(:meth:`Expiries.wall`, recomputed at each save), and re-anchored at load (:meth:`Expiries.anchor`: the
seconds left by the wall clock then). So a step while the daemon runs changes nothing; a step while it is
down (no clock spans that) shifts the expiry by the step, as before.
"""

from __future__ import annotations

from collections.abc import Hashable

from aithermd.clock import Clock


class Expiries:
    """{key: boot-clock s at which it expires}; ``clock``: the daemon's clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.at: dict[Hashable, float] = {}
        self._offset = clock.wall() - clock.boottime()  # wall − boot clock when last saved (mark)

    def set(self, key: Hashable, seconds: float) -> float | None:
        """``key`` expires ``seconds`` (> 0) from now; returns the wall time that is now (s since the epoch,
        for display and the state file), None (and no expiry) for ``seconds`` ≤ 0."""
        if not seconds > 0:
            self.at.pop(key, None)
            return None
        self.at[key] = self._clock.boottime() + seconds
        return self._clock.wall() + seconds

    def anchor(self, key: Hashable, expires_wall: float) -> None:
        """Re-anchor a loaded expiry (wall s since the epoch) on this run's boot clock."""
        self.at[key] = self._clock.boottime() + (expires_wall - self._clock.wall())

    def wall(self, key: Hashable, fallback: float | None) -> float | None:
        """The wall time ``key`` expires at by the wall clock now; ``fallback`` when it has no expiry."""
        at = self.at.get(key)
        return fallback if at is None else self._clock.wall() + (at - self._clock.boottime())

    def mark(self) -> None:
        """The expiries were saved (as :meth:`wall` gives them now)."""
        self._offset = self._clock.wall() - self._clock.boottime()

    def stepped(self) -> bool:
        """Whether the wall clock moved a second or more against the boot clock since :meth:`mark` (an NTP
        step): the wall times saved and shown are to be written again."""
        return abs(self._clock.wall() - self._clock.boottime() - self._offset) >= 1.0

    def pop_due(self) -> set[Hashable]:
        """The keys whose time is up, forgotten (a key set again after its item ended is simply replaced)."""
        now = self._clock.boottime()
        due = {k for k, at in self.at.items() if at <= now}
        for k in due:
            del self.at[k]
        return due
