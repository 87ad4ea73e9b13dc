"""The read guard's reader thread (:class:`_Reader`) and :func:`guarded`: one daemon thread that runs one
pass at a time (see :mod:`aithermd.backends.guard`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

_here = threading.local()


def guarded() -> bool:
    """True on the read guard's thread while its pass is waited for: a backend may make there the calls
    it would otherwise hand to a thread of its own under a deadline (NVML reads its GPUs there, no hop),
    for a call that hangs quarantines its device (``Quarantine``) and the rest of the pass goes on anew."""
    reader = getattr(_here, "reader", None)
    return reader is not None and not reader.cut


class _Reader:
    """One daemon thread that runs one pass at a time, handed over through two bare locks: ``start`` opens
    the one the thread waits on, the thread opens the other when the pass is over. A Future and its
    Condition (pure Python, a lock allocated per wait) cost the loop about twice the CPU per pass at 1 Hz,
    when every tick's code runs from cold caches (about 80 against 35 µs on the build VM).

    A pass handed over for a later time (``at``) is begun then by the thread of its own accord, and once
    passes come at a steady period the thread sleeps from the end of one until the next is due: handing it
    the next one does not wake it (one wake-up a tick, not one for the hand-over and another at ``at``)."""

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._mutex = threading.Lock()  # over what follows, between the thread and the loop
        self._fn: Callable[[], Any] | None = None  # the pass handed over, not begun yet
        self._at: float | None = None  # when to begin it (monotonic s; None: now)
        self._after: Callable[[], None] | None = None  # called when a pass waited for ends
        self._signalled = False  # _go opened, not yet taken by the thread
        self._planned: float | None = None  # when the thread wakes of its own accord (None: on _go only)
        self._last: float | None = None  # the ``at`` of the last pass begun at its time
        self._stopping = False
        self._error: BaseException | None = None
        self._ended = False
        self._late: Callable[[], None] | None = None  # called when a pass given up on ends
        self.cut = False  # the pass was given up on (``guarded()`` turns False in its thread)
        self._thread = threading.Thread(target=self._run, name="aithermd-reads", daemon=True)
        self._thread.start()

    def start(self, fn: Callable[[], Any], at: float | None = None,
              after: Callable[[], None] | None = None) -> None:
        """Hand ``fn`` over, to begin at monotonic ``at`` (None: now); ``after()`` is called in the thread
        once it is over (not when it was given up on)."""
        with self._mutex:
            self._fn, self._at, self._after, self._error, self._ended = fn, at, after, None, False
            if at is None or self._planned is None or self._planned > at + _EARLY_S:
                self._signal()

    def hurry(self) -> None:
        """Begin the pass handed over now, if it waits for its time."""
        with self._mutex:
            if self._fn is not None and self._at is not None:
                self._at = None
                self._signal()

    def cancel(self) -> None:
        """Drop the pass handed over if it has not begun."""
        with self._mutex:
            self._fn = None

    def _signal(self) -> None:  # under _mutex
        if not self._signalled:
            self._signalled = True
            self._go.release()

    def wait(self, timeout_s: float) -> bool:
        """True when the pass is over (its exception raised here), False after ``timeout_s``."""
        if not self._done.acquire(timeout=max(0.0, timeout_s)):
            return False
        if self._error is not None:
            raise self._error
        return True

    def abandon(self, returned: Callable[[], None]) -> bool:
        """Leave the running pass behind: ``returned()`` is called in this thread when it ends, and the
        thread ends then. False when the pass ended meanwhile (:meth:`wait` then answers at once)."""
        with self._mutex:
            if self._ended:
                return False
            self._late, self.cut = returned, True
            return True

    def _run(self) -> None:
        _here.reader = self
        timeout = -1.0
        while True:
            woken = self._go.acquire(timeout=timeout)
            with self._mutex:
                if woken:
                    self._signalled = False
                if self._stopping:
                    return
                fn, at, after = self._fn, self._at, self._after
                now = time.monotonic()
                if fn is None or (at is not None and at - now > _EARLY_S):
                    self._planned = None if fn is None else at  # asleep until handed one, or until its time
                    timeout = -1.0 if fn is None else at - now  # type: ignore[operator]
                    continue
                self._fn = None
                period = at - self._last if at is not None and self._last is not None else None
                if at is not None:
                    self._last = at
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting tick
                self._error = exc
            with self._mutex:
                late = self._late
                if late is None:
                    self._ended = True
                    self._done.release()
                    # the next pass comes one period later: sleep until then (handing it over wakes nobody)
                    self._planned = at + period if at is not None and period and period > 0 else None
                    timeout = -1.0 if self._planned is None else max(0.0, self._planned - time.monotonic())
            if late is not None:
                late()
                return
            if after is not None:
                try:
                    after()
                except Exception:  # noqa: BLE001 - the loop closed meanwhile: nobody waits for it
                    pass

    def stop(self) -> None:
        with self._mutex:
            self._stopping, self._fn = True, None
            self._signal()


_EARLY_S = 0.0005  # a pass due within this (s) is begun at once: a timed wait wakes about this late anyway
