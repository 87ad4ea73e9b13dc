"""Back-off for a device whose reads keep overrunning the read guard's deadline (a *slow* chip, not hung).

An i2c or EC-backed chip that answers in 0.7 s, or drivetemp waking a disk, overruns the read guard's
per-device deadline at every pass, or at every other one. The guard quarantines it, the rest of the pass
reads on, and its read returns a moment later. Read again at each tick it would hold ticks up by the
deadline, and flap (stale, then ok) for ever. So a device whose reads overran :data:`HUNG_PASSES` times
among its last :data:`WINDOW` reads is *held* when the read returns: it stays quarantined (its channels
stale, so its fans go to full through the sensor trust, as for a hung chip) for :data:`BACKOFF_S`, then
read again. The count is of the device's own reads (an overrun, or a pass that read it in time), not of
the passes, whose numbering around the read-ahead says nothing of how often the chip is slow (attack13
A4: a chip slow at every other read reached the hold, or never did, by how passes were numbered; and it
forgot its back-off at the one in-time read after it). Read again after a back-off, a device that
overruns at once, or again :data:`HUNG_PASSES` times in its next :data:`WINDOW` reads, is held for twice
the last back-off, up to :data:`BACKOFF_MAX_S`; only :data:`WINDOW` reads in time in a row forget its
history, the back-off with it. So a chip slow every other read converges to a hold of :data:`BACKOFF_MAX_S`:
40 s, short because a held chip is unread: a critical temperature on it goes unseen for the hold, with
only its fans at full (retest13 R1: at 300 s the CPU's critical power cut waited out a 40 s hold unwritten).

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

HUNG_PASSES = 3  # a device whose reads overran this often among its last WINDOW is held for a back-off
WINDOW = 6  # its last this many reads count; this many in time in a row forget its history
BACKOFF_S = 10.0  # the first back-off (s): a 0.5 s stall every 10 s at most, while the chip stays slow
BACKOFF_MAX_S = 40.0  # the back-off doubles at each hold that follows one, up to this (s): 10, 20, 40

Key = tuple[int, "str | None"]  # (id(backend), device id; None: the backend whole)


class _Entry:
    __slots__ = ("backend", "device", "reads", "backoff_s", "released", "retry")

    def __init__(self, backend: Any, device: str | None) -> None:
        self.backend, self.device = backend, device
        self.reads: list[bool] = []  # its last reads (at most WINDOW), True: overran
        self.backoff_s = 0.0  # the last back-off (s; 0: none yet)
        self.released: int | None = None  # the first pass (``Hangs.seq``) to read it since it was released
        self.retry = False  # read again after a back-off, not read in time since


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
            reads = entry.reads
            reads.append(True)
            if len(reads) > WINDOW:
                del reads[0]
            entry.released = None

    def spared(self, backend: Any, device: str | None) -> None:
        """The read :meth:`hung` was called for ended in time after all: not counted, read again."""
        key = (id(backend), device)
        with self._lock:
            entry = self.track.get(key)
            if entry is not None:
                if entry.reads and entry.reads[-1]:
                    entry.reads.pop()
                entry.released = self.seq
                if True not in entry.reads and not entry.backoff_s and key not in self.held:
                    del self.track[key]

    def returned(self, backend: Any, device: str | None) -> float | None:
        """Its read returned (that read's thread): None to release it now, or the back-off (s) to hold it
        for, counted from now."""
        key = (id(backend), device)
        with self._lock:
            entry = self.track.get(key)
            if entry is None:
                return None
            if not entry.retry and entry.reads.count(True) < HUNG_PASSES:
                entry.released = self.seq
                return None
            entry.backoff_s = BACKOFF_S if not entry.backoff_s else min(2 * entry.backoff_s, BACKOFF_MAX_S)
            entry.reads.clear()  # counted anew once read again
            entry.retry = False
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
                    entry.retry = True
                    return [(entry.backend, entry.device)]
        return []

    def passed(self, order: list[Any], seq: int) -> None:
        """Pass ``seq`` over ``order`` ended in time: the devices released before it began were read in
        time, once each; one read in time :data:`WINDOW` times in a row is forgotten (back in service)."""
        ids = {id(b) for b in order}
        with self._lock:
            for key, entry in list(self.track.items()):
                if entry.released is not None and entry.released <= seq and key[0] in ids:
                    reads = entry.reads
                    reads.append(False)
                    if len(reads) > WINDOW:
                        del reads[0]
                    entry.retry = False
                    if len(reads) >= WINDOW and True not in reads:
                        del self.track[key]
    def forget_gone(self, backends: Any) -> None:
        """Drop the history of backends no longer read (a rescan replaced them)."""
        ids = {id(b) for b in backends}
        with self._lock:
            for key in [k for k in self.track if k[0] not in ids and k not in self.held]:
                del self.track[key]
