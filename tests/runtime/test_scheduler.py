"""The deadline scheduler: ticks on the monotonic grid, late ticks skipped not queued, early stop."""

from __future__ import annotations

import asyncio

import pytest

from aithermd.runtime.scheduler import Scheduler


async def test_ticks_on_the_grid(clock):
    t = Scheduler(1.0, clock, clock.sleep)
    seen = []

    async def tick(seq, deadline):
        seen.append((seq, deadline, clock.monotonic()))
        clock.advance(0.1)  # the tick's own work

    await t.run(tick, asyncio.Event(), max_ticks=3)
    t0 = seen[0][1]
    assert [(s, d - t0) for s, d, _ in seen] == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert all(now == d for _, d, now in seen) and t.skipped == 0


async def test_a_late_tick_skips_the_missed_deadlines(clock):
    t = Scheduler(1.0, clock, clock.sleep)
    seen = []

    async def tick(seq, deadline):
        seen.append(deadline)
        if seq == 2:
            clock.advance(2.5)  # overruns the deadlines at +2 and +3

    await t.run(tick, asyncio.Event(), max_ticks=4)
    t0 = seen[0]
    assert [d - t0 for d in seen] == [0.0, 1.0, 4.0, 5.0]
    assert t.skipped == 2


async def test_stop_ends_the_wait_at_once():
    from aithermd.clock import RealClock
    t = Scheduler(30.0, RealClock())
    stop = asyncio.Event()
    ticks = []

    async def tick(seq, deadline):
        ticks.append(seq)
        asyncio.get_running_loop().call_soon(stop.set)

    await asyncio.wait_for(t.run(tick, stop), timeout=5.0)  # would wait 30 s without the stop
    assert ticks == [1]


async def test_until_stops_after_the_tick(clock):
    t = Scheduler(1.0, clock, clock.sleep)
    ticks = []

    async def tick(seq, deadline):
        ticks.append(seq)

    await t.run(tick, asyncio.Event(), until=lambda: len(ticks) == 2)
    assert ticks == [1, 2]


def test_period_must_be_positive(clock):
    with pytest.raises(ValueError):
        Scheduler(0.0, clock)


async def test_real_time_ticks_wait_for_their_deadline_on_one_timer():
    from aithermd.clock import RealClock
    clock = RealClock()
    t = Scheduler(0.02, clock)
    seen = []

    async def tick(seq, deadline):
        seen.append((seq, deadline, clock.monotonic()))

    await asyncio.wait_for(t.run(tick, asyncio.Event(), max_ticks=3), timeout=10.0)
    assert [s for s, _, _ in seen] == [1, 2, 3]
    assert all(now >= deadline for _, deadline, now in seen)  # never before its deadline
    steps = (seen[2][1] - seen[0][1]) / 0.02  # on the grid: 2 periods, more when a tick came so late under
    assert steps >= 2 - 1e-6 and abs(steps - round(steps)) < 1e-6  # load that the next deadline was skipped


async def test_a_tick_whose_reads_are_taken_ahead_is_woken_by_them_not_by_its_timer():
    """The read guard's thread takes the tick's reads at its due time and wakes the wait (one wake of the
    loop a tick): the wait's own timer is only a fallback, ``margin`` past the deadline."""
    import threading

    from aithermd.clock import RealClock
    t = Scheduler(1000.0, RealClock())  # the timer alone would hold the second tick for 1000 s
    armed: list[float] = []

    def ahead(at, wake):
        armed.append(at)
        threading.Thread(target=wake).start()  # the reads are over: woken from another thread
        return 1000.0

    t.ahead = ahead
    ticks: list[int] = []

    async def tick(seq, deadline):
        ticks.append(seq)

    await asyncio.wait_for(t.run(tick, asyncio.Event(), max_ticks=3), timeout=30.0)
    assert ticks == [1, 2, 3] and len(armed) == 2  # armed for each tick that waited (not the first)
    assert armed[1] > armed[0]  # each for the next deadline on the grid


async def test_a_tick_not_taken_ahead_waits_for_its_timer_as_before():
    from aithermd.clock import RealClock
    t = Scheduler(0.01, RealClock(), ahead=lambda at, wake: None)  # nothing armed (a tick running, ...)
    ticks: list[int] = []

    async def tick(seq, deadline):
        ticks.append(seq)

    await asyncio.wait_for(t.run(tick, asyncio.Event(), max_ticks=3), timeout=30.0)
    assert ticks == [1, 2, 3]


async def test_a_wake_from_reads_that_ended_late_does_not_end_the_next_wait():
    """attack11 G0: a GPU answering just past the guard's deadline ends its pass after the wait it was armed
    for has ended on its fallback timer. Its wake then ended whichever wait was in progress: the next tick
    ran at once, armed the next late wake, and so on (195 ticks a second), while every early tick pushed the
    grid a period further ahead (hours), after which nothing ticked. A wake ends only the wait it was armed
    for, and the next deadline stays within one period of the end of a tick."""
    from aithermd.clock import RealClock

    clock = RealClock()
    t = Scheduler(1000.0, clock)  # no timer ends a wait within this test
    wakes: list = []
    t.ahead = lambda at, wake: wakes.append(wake) or 0.0
    ticks: list[tuple[int, float, float]] = []

    async def tick(seq, deadline):
        ticks.append((seq, deadline, clock.monotonic()))

    stop = asyncio.Event()
    run = asyncio.ensure_future(t.run(tick, stop))
    for _ in range(100):
        await asyncio.sleep(0)
    assert [s for s, _, _ in ticks] == [1] and len(wakes) == 1  # tick 1 at once, then waiting for tick 2
    wakes[0]()  # tick 2's reads are over: it runs
    while len(wakes) < 2:
        await asyncio.sleep(0.001)
    assert [s for s, _, _ in ticks] == [1, 2]
    wakes[0]()  # tick 2's wake again, late, while tick 3 waits: nothing happens
    for _ in range(3):
        await asyncio.sleep(0.01)
    assert [s for s, _, _ in ticks] == [1, 2] and len(wakes) == 2
    wakes[1]()
    while len(wakes) < 3:
        await asyncio.sleep(0.001)
    assert [s for s, _, _ in ticks] == [1, 2, 3]
    # woken early each time, the grid still stays within one period of now
    assert all(deadline - now <= 1000.0 for _, deadline, now in ticks)
    assert t.seq == 3 and max(d for _, d, _ in ticks) - ticks[0][1] <= 2000.0 + 1.0
    stop.set()
    await asyncio.wait_for(run, 10.0)
