"""Deadline scheduler on the monotonic clock: ticks at ``start + k × period``; a late tick is skipped, not
queued.

When a tick overruns one or more deadlines, those deadlines are counted in :attr:`Scheduler.skipped` and the
next tick runs at the first deadline still in the future, so a slow tick never causes a burst of catch-up
ticks. The clock and the sleep are injected (the simulator drives a simulated clock; the sleep then advances
it). Waiting ends early when the stop event is set.

In real time a wait may also be ended by the read guard's thread once the tick's reads, taken at its due
time, are over (``ahead``). That wake is bound to the wait it was armed for: a pass that ends after its
wait's fallback timer (a GPU answering just past the guard's deadline) must not end the next wait at once
(attack11 G0: each such late wake started a tick early, which armed the next late wake — up to 195 ticks a
second — and pushed the grid hours ahead, after which the daemon stopped ticking). And the next deadline is
never more than one period past the end of a tick, whatever woke it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import structlog

from aithermd.clock import Clock

Sleep = Callable[[float], Awaitable[object]]
TickFn = Callable[[int, float], Awaitable[object]]
Ahead = Callable[[float, Callable[[], None]], "float | None"]


class Scheduler:
    """``period_s`` in s; ``tick(seq, deadline)`` gets 1, 2, … and the monotonic deadline it was due at."""

    def __init__(self, period_s: float, clock: Clock, sleep: Sleep = asyncio.sleep,
                 ahead: Ahead | None = None) -> None:
        if not period_s > 0:
            raise ValueError(f"period must be > 0 s, not {period_s}")
        self.period_s = period_s
        self.clock = clock
        self.sleep = sleep
        self.ahead = ahead
        self.seq = 0
        self.skipped = 0
        self.last_duration_s = 0.0
        self._log = structlog.get_logger("aithermd.scheduler")
        self._stopper: asyncio.Task[object] | None = None  # waits on the stop event while run() runs
        self._woken: asyncio.Future[None] | None = None  # the real-time wait in progress

    async def run(self, tick: TickFn, stop: asyncio.Event, max_ticks: int | None = None,
                  until: Callable[[], bool] | None = None) -> None:
        """Run ``tick`` at each deadline until ``stop`` is set, ``max_ticks`` ran or ``until()`` is true
        after a tick. Exceptions from ``tick`` propagate (the caller decides)."""
        try:
            await self._run(tick, stop, max_ticks, until)
        finally:
            stopper, self._stopper = self._stopper, None
            if stopper is not None and not stopper.done():
                stopper.cancel()
                try:
                    await stopper
                except asyncio.CancelledError:
                    if not stopper.cancelled():  # this task's own cancellation
                        raise

    async def _run(self, tick: TickFn, stop: asyncio.Event, max_ticks: int | None,
                   until: Callable[[], bool] | None) -> None:
        deadline = self.clock.monotonic()
        while not stop.is_set():
            if max_ticks is not None and self.seq >= max_ticks:
                return
            delay = deadline - self.clock.monotonic()
            if delay > 0:
                await self._wait(delay, stop)
                if stop.is_set():
                    return
            self.seq += 1
            started = self.clock.monotonic()
            await tick(self.seq, deadline)
            now = self.clock.monotonic()
            self.last_duration_s = now - started
            if until is not None and until():
                return
            deadline += self.period_s
            if deadline - now > self.period_s:  # the tick ran before its deadline: keep the grid near now
                deadline = now + self.period_s
            elif now >= deadline:
                missed = math.floor((now - deadline) / self.period_s) + 1
                self.skipped += missed
                deadline += missed * self.period_s
                self._log.warning("tick_late", seq=self.seq, duration_s=round(self.last_duration_s, 4),
                                  skipped=missed)

    async def _wait(self, delay: float, stop: asyncio.Event) -> None:
        """Sleep ``delay`` s with the injected sleep, ending early when ``stop`` is set. In real time this is
        one timer and one future (no task created and cancelled per tick)."""
        if self.sleep is asyncio.sleep:
            # one timer and one future a tick; the stop event is waited on by one task for the whole run,
            # whose one done callback wakes the wait in progress (an ``asyncio.timeout`` around
            # ``stop.wait()`` cancelled the waiting task and raised two exceptions through it at every tick;
            # a callback added and removed per wait cost a partial and two list edits)
            loop = asyncio.get_running_loop()
            if self._stopper is None:
                self._stopper = loop.create_task(stop.wait())
                self._stopper.add_done_callback(self._stopped)
            woken = self._woken = loop.create_future()
            # the tick's reads taken at its due time by the read guard's thread, which wakes this wait
            # once they are over: the loop wakes once a tick, not on its timer and again for the reads
            margin = self.ahead(time.monotonic() + delay, _waker(loop, woken)) \
                if self.ahead is not None else None
            timer = loop.call_later(delay + (margin or 0.0), _wake, woken)
            if self._stopper.done():  # set meanwhile (its callback ran already): end at once, as it would
                loop.call_soon(_wake, woken)
            try:
                await woken
            finally:
                timer.cancel()
                self._woken = None
            return
        sleeper = asyncio.ensure_future(self.sleep(delay))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((sleeper, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                if not task.done():
                    task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    def _stopped(self, _: object) -> None:
        if self._woken is not None:
            _wake(self._woken)


def _waker(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> Callable[[], None]:
    """Wakes the wait ``woken``, from another thread; a no-op once that wait is over, whichever wait is in
    progress then (see the module doc)."""
    return lambda: loop.call_soon_threadsafe(_wake, woken)


def _wake(woken: asyncio.Future[None], *_: object) -> None:
    if not woken.done():
        woken.set_result(None)
