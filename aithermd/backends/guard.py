"""Hung reads: the inline backends are read in a thread of their own, against a deadline.

A sysfs read can block for ever: an embedded controller that stops answering ACPI ``_TMP``, an i2c bus
stuck with a chip holding SDA low, a driver waiting on a mutex its firmware never releases. Read on the
event loop, such a read stops the loop, the D-Bus service and the SIGTERM handler with it. So
:class:`ReadGuard` runs each tick's pass over the inline backends in its reader thread (a daemon thread:
it never holds up the process's exit) and waits for each device at most ``deadline_s``. The wait is a
plain wait on the thread's result, not an asyncio hop (waking the loop from a thread cost more than the
reads): the loop is held for the pass's own microseconds, and for ``deadline_s`` once when a read hangs —
from then on the hung device is skipped, and a SIGTERM that came meanwhile is handled as soon as the wait
ends. A pass is:

- in time (the normal case): the samples, as if read on the loop;
- late: each device has a deadline of its own, ``deadline_s`` from when its read began. When the pass is
  slow the loop looks at where it is ``LOOKS`` times per deadline (no cost while nothing is slow: the
  pass is over before the first look) and counts a device's read from the last look that saw another
  one. A device past its deadline is *quarantined* in its backend (``Quarantine``): later passes skip it
  and report its channels :attr:`~aithermd.model.Status.STALE` ("read hung ..."), so its fans go to full
  through the safety layer, while the rest of the pass goes on at this tick on a new thread (its backend
  read again without it, then the backends after it): one slow chip never blinds the devices read after
  it. The stuck thread is left behind. When the read returns at last, its device is released and read
  again, unless it overran at each of its last passes: then it is held for a back-off
  (:mod:`aithermd.backends.hangs`), so a merely slow chip is not read, and the tick held up, every tick.

A backend takes part through :class:`Quarantine` (hwmon and thermal zones do): it records the device it is
reading (``reading``) and skips quarantined ones. A backend without it is quarantined whole (``_busy``).
Devices a pass could not read at all (its thread never began it) are reported failed with ``ETIMEDOUT``
(a transient class: the sensor trust carries their last good values over this one tick).

The same pass reads the threaded backends (NVML) after the inline ones, so a tick hands its reads to
another thread once, not once here and again to the loop's worker (an asyncio hop that woke the loop
through its self-pipe). Such a backend's part of the pass gets a ``budget`` of its own, counted from when
it begins; past it, it is held whole, as above, until its sample returns. NVML reads its healthy GPUs in
this thread itself (:func:`guarded`; no hop to its worker, two thread wake-ups a tick fewer) as a
:class:`Quarantine` with a deadline per GPU (``hung_at``: from the last NVML call that began, and a budget
for the GPU's whole read): a GPU whose read overruns is quarantined (held hung on the worker: its knobs
refused, its readings stale) and the rest of the pass — the other GPUs, at this tick — runs on a new
thread; once it returns, that GPU is read again, or held for a back-off as a slow chip is (not read, its
readings stale, its knobs written as usual: :mod:`aithermd.backends.nvml_pass`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from aithermd.backends.hangs import Hangs
from aithermd.backends.reader import _Reader, guarded
from aithermd.model import Reading, Sample, Status

DEADLINE_S = 0.5  # a sysfs read answers in µs, an EC-backed ACPI zone in tens of ms: 0.5 s is a hang
LOOKS = 10  # a slow pass is looked at this often per deadline: a device counts as hung after 0.9-1 deadline
ETIMEDOUT = "ETIMEDOUT: not read this tick: the pass was cut short by a hung read"


class Quarantine:
    """The part of a backend the guard works with: ``reading`` is the device id being read now (set by
    ``sample()``), ``skip`` device id → why, for devices whose read hangs."""

    reading: str | None = None
    skip: dict[str, str]

    def hung_at(self) -> float | None:
        """For a backend with a deadline per device (NVML): the monotonic time (s) by which the device being
        read counts as hung, its progress counted; None (the default): ``deadline_s`` from when its read
        began."""
        return None


__all__ = ["DEADLINE_S", "ETIMEDOUT", "LOOKS", "Quarantine", "ReadGuard", "guarded"]


class _Run:
    """One pass handed to the reader thread: ``got`` its samples by ``id(backend)``, ``state`` the backend
    it reads and when it counts as hung (from when it begins: a pass taken ahead begins at ``at``)."""

    __slots__ = ("order", "budget", "reader", "got", "state", "stale", "seq")

    def __init__(self, order: list[Any], budget: Callable[[Any], float | None] | None, reader: _Reader,
                 at: float, seq: int) -> None:
        self.order, self.budget, self.reader, self.seq = order, budget, reader, seq
        self.got: dict[int, Sample] = {}
        # t0: when the pass began (planned, then as begun); end: the budget's end of the backend being read
        self.state: dict[str, Any] = {"t0": at, "end": None, "backend": None}
        self.stale = False  # taken ahead for backends that changed since: waited for, not used


class ReadGuard:
    """Runs ``sample(backend)`` over the backends in its reader thread, ``deadline_s`` at most (see the module
    doc)."""

    def __init__(self, deadline_s: float = DEADLINE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline_s = deadline_s
        self.look_s = deadline_s / LOOKS  # how often the loop looks at a pass that is not over
        self.hangs = 0
        self._hangs = Hangs(clock)  # devices that overran at their last passes; back-offs (clock: their time)
        self._reader: _Reader | None = None
        self._busy: set[int] = set()  # backends (whole) held by a stuck pass that cannot quarantine a device
        self._ahead: _Run | None = None  # the next pass, taken at the tick's due time (ahead())
        self._log = structlog.get_logger("aithermd.guard")

    def held(self, backend: Any) -> bool:
        """True while ``backend`` is held hung whole (its pass stuck with no device of its own to quarantine;
        a :class:`Quarantine` backend's hung devices are its ``skip``)."""
        return id(backend) in self._busy

    def slow(self, backend: Any, device: str | None = None) -> bool:
        """True while ``device`` of ``backend`` (None: the backend whole) is held for a back-off only: its
        reads answer, slowly (:mod:`aithermd.backends.hangs`), none hangs now."""
        return (id(backend), device) in self._hangs.held

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
        if self._hangs.held and self._ahead is None:  # a pass taken ahead released one already (ahead())
            self._release_due()
        if self._hangs.track:
            self._hangs.forget_gone(backends)
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
        if self._ahead is not None:
            return False
        if self._hangs.held:
            self._release_due()
        order = [b for b in backends if id(b) not in self._busy]
        if not order:
            return False
        self._ahead = self._start(order, sample, budget, at, after)
        return True

    def margin_s(self) -> float:
        """How long past its due time a pass taken ahead may run before the tick waits for it (s): the
        deadline, or one look when a device overran lately (looked at from its start, a slow device is
        told from the ones read before it)."""
        return self.look_s if self._hangs.track else self.deadline_s

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
                   self._hangs.seq)
        self._hangs.seq += 1
        got, state = run.got, run.state

        def one_pass() -> None:
            state["t0"] = time.monotonic()  # a pass taken ahead: from when it begins
            for b in order:
                if reader.cut:  # given up on: what follows is read by the next pass
                    return
                state["backend"] = b
                if budget is not None:
                    extra = budget(b)
                    state["end"] = None if extra is None else time.monotonic() + extra
                got[id(b)] = sample(b)
            state["backend"] = None

        reader.start(one_pass, at, after)
        return run

    def _finish(self, run: _Run, done: dict[int, Sample]) -> list[Any]:
        """Wait for ``run`` (see the module doc), its samples into ``done``; returns the backends still to
        read on a new thread: none, unless the pass hung in a device (its backend is read again without
        it, then the ones after it) or in a backend held whole (the ones after it)."""
        # a plain wait, not an asyncio hop: the pass takes microseconds, and waking the loop from the thread
        # (call_soon_threadsafe, the self-pipe) cost more than the reads themselves
        reader, state, order = run.reader, run.state, run.order
        rest: list[Any] = []
        wait_s = look_s = self.look_s
        seen: tuple[Any, str | None] | None = None  # what the last look saw being read (backend, device)
        since = last = 0.0  # when it began at the earliest (the look before); the last look
        while not reader.wait(wait_s):
            now = time.monotonic()
            backend = state["backend"]
            device = backend.reading if isinstance(backend, Quarantine) else None
            if seen is None or backend is not seen[0] or device != seen[1]:
                since = max(state["t0"], last)  # it began after the last look (or with the pass)
                seen = (backend, device)
            last = now
            end = self._end(backend, since, state)
            if now < end:
                wait_s = min(look_s, end - now)
                continue
            if not self._hung(backend, device, reader, run.budget):
                continue  # the pass ended meanwhile after all: the wait answers at once
            if backend is not None:
                at = order.index(backend)
                rest = order[at if device is not None else at + 1:]
            break
        else:
            if self._hangs.track:
                self._hangs.passed(order, run.seq)
        again = {id(b) for b in rest}
        done.update((k, v) for k, v in list(run.got.items()) if k not in again)
        return rest

    def _end(self, backend: Any, since: float, state: dict[str, Any]) -> float:
        """When the read in progress counts as hung: the backend's own device deadline (NVML), else
        ``deadline_s`` after ``since``, or the end of the budget of the backend read, if later."""
        at = backend.hung_at() if isinstance(backend, Quarantine) else None
        if at is not None:
            return at
        end, budget_end = since + self.deadline_s, state["end"]
        return end if budget_end is None or budget_end < end else budget_end

    def _hung(self, backend: Any, device: str | None, reader: _Reader,
              budget: Callable[[Any], float | None] | None) -> bool:
        """The pass is stuck in ``backend``: quarantine ``device``, the one it reads (None: the backend
        whole), leave the thread behind. False when the pass ended meanwhile after all. An inline backend's
        device (or a GPU) that overran at each of its last passes is held for a back-off once its read
        returns."""
        why = f"read hung: no answer within {self.deadline_s:g} s"
        # an inline backend's device or backend, a threaded one's device (a GPU: NVML's own budget per GPU)
        tracked = backend is not None and (device is not None or budget is None or budget(backend) is None)

        def returned() -> None:
            held_s = self._hangs.returned(backend, device) if tracked else None
            if held_s is None:
                self._release(backend, device)
            elif device is not None:
                backend.skip[device] = (f"read slow: over {self.deadline_s:g} s at each of its last passes; "
                                        f"read again in {held_s:g} s")
            self._log.warning("read_returned", device=device or getattr(backend, "kind", "?"),
                              **({"held_s": held_s} if held_s is not None else {}))

        if device is not None:  # held (and counted) before the pass may end and release it
            backend.skip[device] = why
        elif backend is not None:
            self._busy.add(id(backend))
        if tracked:
            self._hangs.hung(backend, device)
        if not reader.abandon(returned):
            self._release(backend, device)
            if tracked:
                self._hangs.spared(backend, device)
            return False
        self.hangs += 1
        self._reader = None  # the stuck thread ends after its pass; the next pass gets a new one
        if device is not None:
            self._log.error("read_hung", device=device, deadline_s=self.deadline_s)
        elif backend is not None:
            kind = getattr(backend, "kind", "?")  # held whole: the backend is the device (attack12 SH2)
            self._log.error("read_hung", device=kind, backend=kind, deadline_s=self.deadline_s)
        return True

    def _release(self, backend: Any, device: str | None) -> None:
        if device is not None:
            backend.skip.pop(device, None)
        self._busy.discard(id(backend))

    def _release_due(self) -> None:
        """Read again the devices whose back-off is over."""
        for backend, device in self._hangs.due():
            self._release(backend, device)
            self._log.info("read_retry", device=device or getattr(backend, "kind", "?"))

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
