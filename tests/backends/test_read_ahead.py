"""The read guard's pass taken ahead: the reader thread begins it at the tick's due time of its own accord
and wakes the loop once it is over (one wake-up of each thread a tick); the tick's ``sample`` takes it; a
pass for backends that changed since is waited for and read anew; at a steady period, handing the thread
its next pass does not wake it."""

from __future__ import annotations

import asyncio
import threading
import time

from aithermd.backends.guard import ReadGuard, _Reader
from aithermd.model import Reading, Sample


class Counted:
    def __init__(self, name: str) -> None:
        self.name, self.reads, self.threads = name, 0, set()

    def sample(self) -> Sample:
        self.reads += 1
        self.threads.add(threading.current_thread().name)
        cid = f"{self.name}/temp"
        return Sample(0.0, {cid: Reading(cid, float(self.reads))})


def channels(b):
    return [f"{b.name}/temp"]


def test_a_pass_taken_ahead_is_read_at_its_time_and_taken_by_the_tick():
    a, b = Counted("a"), Counted("b")
    guard = ReadGuard(deadline_s=5.0)
    over = threading.Event()
    try:
        assert guard.ahead([a, b], lambda x: x.sample(), None, time.monotonic(), over.set)
        assert over.wait(10), "the reader thread began the pass of its own accord and said so"
        assert (a.reads, b.reads) == (1, 1) and a.threads == {"aithermd-reads"}
        got = asyncio.run(guard.sample([a, b], lambda x: x.sample(), channels, time.monotonic))
        assert [s.readings[f"{x.name}/temp"].value for s, x in zip(got, (a, b), strict=True)] == [1.0, 1.0]
        assert (a.reads, b.reads) == (1, 1)  # taken, not read again
        got = asyncio.run(guard.sample([a, b], lambda x: x.sample(), channels, time.monotonic))
        assert (a.reads, b.reads) == (2, 2)  # nothing ahead: read as before
    finally:
        guard.close()


def test_a_pass_ahead_for_other_backends_or_not_yet_due_is_read_at_once_by_the_tick():
    a, b = Counted("a"), Counted("b")
    guard = ReadGuard(deadline_s=5.0)
    try:
        assert guard.ahead([a], lambda x: x.sample(), None, time.monotonic() + 3600.0, lambda: None)
        got = asyncio.run(guard.sample([a, b], lambda x: x.sample(), channels, time.monotonic))
        assert [s.readings[f"{x.name}/temp"].value for s, x in zip(got, (a, b), strict=True)] == [2.0, 1.0]
        assert guard.ahead([a], lambda x: x.sample(), None, time.monotonic() + 3600.0, lambda: None)
        guard.forget()  # a new world: the pass ahead is not used
        (got,) = asyncio.run(guard.sample([a], lambda x: x.sample(), channels, time.monotonic))
        assert got.readings["a/temp"].value == 4.0 and a.reads == 4  # sent on at once, then read anew
    finally:
        guard.close()


def test_at_a_steady_period_the_next_pass_is_handed_over_without_waking_the_thread():
    reader = _Reader()
    signals = []
    signal = reader._signal

    def counted():
        signals.append(1)
        signal()

    reader._signal = counted  # type: ignore[method-assign]
    try:
        at = time.monotonic()
        for k in range(3):
            reader.start(lambda: None, at + 0.3 * k)
            assert reader.wait(10)
        assert len(signals) == 2  # the first two woke it; from then on it sleeps until the next is due
        reader.start(lambda: None, at + 0.3 * 3)
        assert len(signals) == 2
        assert reader.wait(10)
    finally:
        reader.stop()
