"""The fast lane's reads off the NVML worker against the worker's handle changes (readers.HandleGuard):
a read never waits; a change waits for the reads in flight, for a bounded time only."""

from __future__ import annotations

import threading

from aithermd.backends.readers import HandleGuard


def _until(cond, tries=1000):
    event = threading.Event()
    for _ in range(tries):
        if cond():
            return True
        event.wait(0.005)
    return False


def test_a_change_waits_for_the_read_in_flight_and_no_read_begins_meanwhile():
    guard, order = HandleGuard(), []
    assert guard.enter() is True  # a read in flight

    def change():
        with guard.exclusive(30.0):
            order.append("changed")

    worker = threading.Thread(target=change)
    worker.start()
    assert _until(lambda: guard.changing)
    assert guard.enter() is False  # no read begins while handles change
    assert order == []  # waiting for the read in flight
    guard.leave()
    worker.join(10.0)
    assert order == ["changed"] and not guard.changing and guard.enter() is True


def test_a_read_stuck_in_a_hung_gpu_holds_a_change_up_for_its_wait_only():
    guard = HandleGuard()
    assert guard.enter() is True  # never leaves: stuck in a hung GPU
    with guard.exclusive(0.0):
        assert guard.changing
    assert not guard.changing and guard.enter() is True
