"""Hung reads: the inline backends are read in a thread of their own, against a deadline.

A sysfs read can block for ever: an embedded controller that stops answering ACPI ``_TMP``, an i2c bus
stuck with a chip holding SDA low, a driver waiting on a mutex its firmware never releases. Read on the
event loop, such a read stops the loop, the D-Bus service and the SIGTERM handler with it. So
:class:`ReadGuard` runs each tick's pass over the inline backends in its reader thread (a daemon thread:
it never holds up the process's exit) and waits for it at most ``deadline_s``. The wait is a plain wait on
the thread's result, not an asyncio hop (waking the loop from a thread cost more than the reads): the loop
is held for the pass's own microseconds, and for ``deadline_s`` once when a read hangs — from then on the
hung device is skipped, and a SIGTERM that came meanwhile is handled as soon as the wait ends.


- in time (the normal case): the samples, as if read on the loop;
- late: the device the pass was reading is *quarantined* in its backend (``Quarantine``): later passes
  skip it and report its channels :attr:`~aithermd.model.Status.STALE` ("read hung ..."), so its fans go to
  full through the safety layer, while every other device reads on. Devices the cut-short pass had not read
  this tick are reported failed with ``ETIMEDOUT`` (a transient class: the sensor trust carries their last
  good values over this one tick). The stuck thread is left behind; the next pass runs in a new one.
  When the hung read returns at last, its device is released and read again.

A backend takes part through :class:`Quarantine` (hwmon and thermal zones do): it records the device it is
reading (``reading``) and skips quarantined ones. A backend without it is quarantined whole while hung.

The same pass reads the threaded backends (NVML) after the inline ones, so a tick hands its reads to
another thread once, not once here and again to the loop's worker (an asyncio hop that woke the loop
through its self-pipe). Such a backend's part of the pass gets a ``budget`` of its own, counted from when
it begins; past it, it is held whole, as above, until its sample returns. NVML reads its healthy GPUs in
this thread itself (:func:`guarded`; no hop to its worker, two thread wake-ups a tick fewer) as a
:class:`Quarantine` with a deadline per GPU (``hung_at``, from the last NVML call that began): a GPU whose
read hangs is quarantined (held hung on the worker: its knobs refused, its readings stale) and the rest of
the pass — the other GPUs, at this tick — runs on a new thread; once it returns, that GPU is read on the
worker under its own deadline from then on (:mod:`aithermd.backends.nvml_pass`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from aithermd.model import Reading, Sample, Status

DEADLINE_S = 0.5  # a sysfs read answers in µs, an EC-backed ACPI zone in tens of ms: 0.5 s is a hang
ETIMEDOUT = "ETIMEDOUT: not read this tick: the pass was cut short by a hung read"


class Quarantine:
    """The part of a backend the guard works with: ``reading`` is the device id being read now (set by
    ``sample()``), ``skip`` device id → why, for devices whose read hangs."""

    reading: str | None = None
    skip: dict[str, str]

    def hung_at(self) -> float | None:
        """For a backend with a deadline per device (NVML): the monotonic time (s) by which the device being
        read counts as hung, its progress counted; None (the default): the pass's deadline."""
        return None


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


class _Run:
    """One pass handed to the reader thread: ``got`` its samples by ``id(backend)``, ``state`` the backend
    it reads and when it counts as hung (from when it begins: a pass taken ahead begins at ``at``)."""

    __slots__ = ("order", "budget", "reader", "got", "state", "stale")

    def __init__(self, order: list[Any], budget: Callable[[Any], float | None] | None, reader: _Reader,
                 at: float, deadline_s: float) -> None:
        self.order, self.budget, self.reader = order, budget, reader
        self.got: dict[int, Sample] = {}
        self.state: dict[str, Any] = {"end": at + deadline_s, "backend": None}
        self.stale = False  # taken ahead for backends that changed since: waited for, not used


class ReadGuard:
    """Runs ``sample(backend)`` over the backends in its reader thread, ``deadline_s`` at most (see the module
    doc)."""

    def __init__(self, deadline_s: float = DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self.hangs = 0
        self._reader: _Reader | None = None
        self._busy: set[int] = set()  # backends (whole) held by a stuck pass that cannot quarantine a device
        self._ahead: _Run | None = None  # the next pass, taken at the tick's due time (ahead())
        self._log = structlog.get_logger("aithermd.guard")

    async def sample(self, backends: Sequence[Any], sample: Callable[[Any], Sample],
                     channels: Callable[[Any], Sequence[str]], now: Callable[[], float],
                     budget: Callable[[Any], float | None] | None = None) -> list[Sample]:
        """One pass of ``sample(backend)`` over ``backends``; every backend gets a sample, hung or not (see
        the module doc). ``channels(backend)``: its channel ids, for the samples of backends not read.
        ``budget(backend)``: for a backend that guards its own calls (NVML: a deadline per GPU on its
        worker), how long its part of the pass may take from when it begins (s); None (and for every
        backend without ``budget``): the pass's ``deadline_s``."""
        if not backends:
            return []
        done: dict[int, Sample] = {}
        order = [b for b in backends if id(b) not in self._busy]
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # taken at the tick's due time (:meth:`ahead`)
            ahead.reader.hurry()
            rest = self._finish(ahead, done)
            if ahead.stale or len(ahead.order) != len(order) or \
                    any(a is not b for a, b in zip(ahead.order, order, strict=True)):
                done.clear()  # the backends changed since (a rescan): read anew
                rest = order
            order = rest
        while order:
            order = self._finish(self._start(order, sample, budget), done)
        t = now()
        return [done.get(id(b)) or self._unread(b, channels(b), t) for b in backends]

    def ahead(self, backends: Sequence[Any], sample: Callable[[Any], Sample],
              budget: Callable[[Any], float | None] | None, at: float, after: Callable[[], None]) -> bool:
        """Take the next pass in the reader thread at monotonic ``at`` (s) of its own accord, and call
        ``after()`` there once it is over: the loop sleeps until ``after`` wakes it, not until a timer of
        its own and again for the pass (one thread wake-up a tick fewer). The next :meth:`sample` takes
        that pass (it sends it on at once if it still waits, and reads anew when the backends changed).
        False (nothing started) while a pass is already ahead."""
        order = [b for b in backends if id(b) not in self._busy]
        if self._ahead is not None or not order:
            return False
        self._ahead = self._start(order, sample, budget, at, after)
        return True

    def forget(self) -> None:
        """The pass taken ahead is for what no longer holds (a new world): the next :meth:`sample` waits
        for it to end and reads anew."""
        if self._ahead is not None:
            self._ahead.stale = True

    def _start(self, order: list[Any], sample: Callable[[Any], Sample],
               budget: Callable[[Any], float | None] | None, at: float | None = None,
               after: Callable[[], None] | None = None) -> _Run:
        """Start a pass over ``order`` in the reader thread, at monotonic ``at`` (None: now)."""
        if self._reader is None:
            self._reader = _Reader()
        reader = self._reader
        run = _Run(order, budget, reader, time.monotonic() if at is None else max(at, time.monotonic()),
                   self.deadline_s)
        got, state = run.got, run.state

        def one_pass() -> None:
            state["end"] = time.monotonic() + self.deadline_s  # a pass taken ahead: from when it begins
            for b in order:
                if reader.cut:  # given up on: what follows is read by the next pass, if at all
                    return
                state["backend"] = b
                extra = budget(b) if budget is not None else None
                if extra is not None:
                    state["end"] = max(state["end"], time.monotonic() + extra)
                got[id(b)] = sample(b)
            state["backend"] = None

        reader.start(one_pass, at, after)
        return run

    def _finish(self, run: _Run, done: dict[int, Sample]) -> list[Any]:
        """Wait for ``run`` (see the module doc), its samples into ``done``; returns the backends still to
        read on a new thread: none, unless the pass hung in a device of a backend with a budget of its own
        that quarantines it (NVML: the GPU that hangs; the other GPUs are read on at this tick)."""
        # a plain wait, not an asyncio hop: the pass takes microseconds, and waking the loop from the thread
        # (call_soon_threadsafe, the self-pipe) cost more than the reads themselves
        reader, state, order, budget = run.reader, run.state, run.order, run.budget
        rest: list[Any] = []
        while not reader.wait(self._end(state) - time.monotonic()):
            if time.monotonic() < self._end(state):
                continue  # the pass moved on (a backend with a budget, a device with progress) meanwhile
            stuck = state.get("backend")
            device = getattr(stuck, "reading", None) if isinstance(stuck, Quarantine) else None
            if self._hung(stuck, device, reader):
                if device is not None and budget is not None and budget(stuck) is not None:
                    rest = order[order.index(stuck):]
                break
        again = {id(b) for b in rest}
        done.update((k, v) for k, v in list(run.got.items()) if k not in again)
        return rest

    @staticmethod
    def _end(state: dict[str, Any]) -> float:
        """When the pass counts as hung: its deadline, or the device deadline of the backend it reads."""
        backend = state.get("backend")
        at = backend.hung_at() if isinstance(backend, Quarantine) else None
        return state["end"] if at is None else at

    def _hung(self, backend: Any, device: str | None, reader: _Reader) -> bool:
        """The pass is stuck in ``backend``: quarantine ``device``, the one it reads (None: the backend
        whole), leave the thread behind. False when the pass ended meanwhile after all."""
        why = f"read hung: no answer within {self.deadline_s:g} s"

        def returned() -> None:
            if device is not None:
                backend.skip.pop(device, None)
            self._busy.discard(id(backend))
            self._log.warning("read_returned", device=device or getattr(backend, "kind", "?"))

        if device is not None:  # held before the pass may end and release it
            backend.skip[device] = why
        elif backend is not None:
            self._busy.add(id(backend))
        if not reader.abandon(returned):
            if device is not None:
                backend.skip.pop(device, None)
            self._busy.discard(id(backend))
            return False
        self.hangs += 1
        self._reader = None  # the stuck thread ends after its pass; the next pass gets a new one
        if device is not None:
            self._log.error("read_hung", device=device, deadline_s=self.deadline_s)
        elif backend is not None:
            self._log.error("read_hung", backend=getattr(backend, "kind", "?"), deadline_s=self.deadline_s)
        return True

    def _unread(self, backend: Any, channels: Sequence[str], t: float) -> Sample:
        """A sample for a backend the pass did not finish: the channels of a hung device (or of a whole
        backend hung) stale, the others failed with a transient timeout (held over by the sensor trust)."""
        skip = getattr(backend, "skip", None) or {}
        whole = id(backend) in self._busy
        out = {}
        for c in channels:
            why = skip.get(c.rsplit("/", 1)[0])
            if why is None and whole:
                why = f"read hung: no answer within {self.deadline_s:g} s"
            out[c] = (Reading(c, None, Status.STALE, why) if why
                      else Reading(c, None, Status.FAILED, ETIMEDOUT))
        return Sample(t, out)

    def close(self) -> None:
        """Let the reader thread end (a stuck one ends when its read returns; it never holds the exit)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # waiting for its time: it reads nothing now
            ahead.reader.cancel()
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
