"""Back-off for a device whose reads keep overrunning the read guard's deadline (a *slow* chip, not hung).

An i2c or EC-backed chip that answers in 0.7 s, or drivetemp waking a disk, overruns the read guard's
per-device deadline at every pass. The guard quarantines it, the rest of the pass reads on, and its read
returns a moment later. Read again at the next tick it would overrun again and hold every tick up by the
deadline. So a device whose read hung at each of its last :data:`HUNG_PASSES` passes is *held* when the read
returns: it stays quarantined (its channels stale, so its fans go to full through the sensor trust, as for
a hung chip) for :data:`BACKOFF_S`, doubled at each further overrun up to :data:`BACKOFF_MAX_S`, then read
again. A pass that reads it in time returns it to service and forgets its history.

The inline backends' devices and backends are tracked, and the GPUs of NVML (a device of a threaded backend:
its budget per GPU, attack11 G1); a threaded backend held whole is not (the worker's budget covers it).
When several held devices are due at once, one is released per pass (:meth:`Hangs.due`): each retry of
a device still slow costs the loop one deadline, so several slow chips no longer make one tick late by a
deadline each (attack12 SH2).
Everything here runs only once a read overran: when nothing is slow the guard looks at two empty dicts.
Times are the guard's clock (monotonic s)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

HUNG_PASSES = 3  # a device that overran at each of its last this many passes is held for a back-off
BACKOFF_S = 10.0  # the first back-off (s): a 0.5 s stall every 10 s at most, while the chip stays slow
BACKOFF_MAX_S = 300.0  # the back-off doubles at each overrun after one, up to this (s)

Key = tuple[int, "str | None"]  # (id(backend), device id; None: the backend whole)


class _Entry:
    __slots__ = ("backend", "device", "row", "backoff_s", "released")

    def __init__(self, backend: Any, device: str | None) -> None:
        self.backend, self.device = backend, device
        self.row = 0  # passes in a row whose read of it overran
        self.backoff_s = 0.0  # the last back-off (s; 0: none yet)
        self.released: int | None = None  # the first pass (``Hangs.seq``) to read it since it was released


class Hangs:
    """The overrun history of devices (see the module doc). ``seq`` numbers the passes as they start;
    ``held`` maps the devices held for a back-off to when it ends. ``clock()``: monotonic s."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seq = 0
        self.track: dict[Key, _Entry] = {}
        self.held: dict[Key, float] = {}
        self._lock = threading.Lock()  # returned() runs in the thread of the read that overran

    def hung(self, backend: Any, device: str | None) -> None:
        """A read of ``device`` (None: ``backend`` whole) overran its deadline (the loop's thread)."""
        key = (id(backend), device)
        with self._lock:
            entry = self.track.get(key)
            if entry is None:
                entry = self.track[key] = _Entry(backend, device)
            entry.row += 1
            entry.released = None

    def spared(self, backend: Any, device: str | None) -> None:
        """The read :meth:`hung` was called for ended in time after all: not counted, read again."""
        key = (id(backend), device)
        with self._lock:
            entry = self.track.get(key)
            if entry is not None:
                entry.row -= 1
                entry.released = self.seq
                if entry.row <= 0 and key not in self.held:
                    del self.track[key]

    def returned(self, backend: Any, device: str | None) -> float | None:
        """Its read returned (that read's thread): None to release it now, or the back-off (s) to hold it
        for, counted from now."""
        key = (id(backend), device)
        with self._lock:
            entry = self.track.get(key)
            if entry is None or entry.row < HUNG_PASSES:
                if entry is not None:
                    entry.released = self.seq
                return None
            entry.backoff_s = BACKOFF_S if not entry.backoff_s else min(2 * entry.backoff_s, BACKOFF_MAX_S)
            self.held[key] = self.clock() + entry.backoff_s
            return entry.backoff_s

    def due(self) -> list[tuple[Any, str | None]]:
        """The held device whose back-off is over (the one due first), as ``[(backend, device)]``: released,
        to be read again by the next pass (the loop's thread, before a pass starts); [] when none is. One
        a pass: the others wait for the next passes (a tick each)."""
        now = self.clock()
        with self._lock:
            due = [(until, n, key) for n, (key, until) in enumerate(self.held.items()) if until <= now]
            for _, _, key in sorted(due):
                del self.held[key]
                entry = self.track.get(key)
                if entry is not None:
                    entry.released = self.seq
                    return [(entry.backend, entry.device)]
        return []

    def passed(self, order: list[Any], seq: int) -> None:
        """Pass ``seq`` over ``order`` ended in time: the devices released before it began were read in
        time, so their history is forgotten (back in service)."""
        ids = {id(b) for b in order}
        with self._lock:
            for key, entry in list(self.track.items()):
                if entry.released is not None and entry.released <= seq and key[0] in ids:
                    del self.track[key]

    def forget_gone(self, backends: Any) -> None:
        """Drop the history of backends no longer read (a rescan replaced them)."""
        ids = {id(b) for b in backends}
        with self._lock:
            for key in [k for k in self.track if k[0] not in ids and k not in self.held]:
                del self.track[key]
