"""nvml_pass.Pass: the end of NvmlWorker.each's hand-off on bare locks, as much of a Future as each() and the
worker thread use."""

from __future__ import annotations

import threading
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from aithermd.backends.nvml_pass import Pass


def test_a_result_waits_for_the_call_and_is_given_to_every_ask():
    p = Pass()
    assert not p.running() and not p.done()
    with pytest.raises(FutureTimeout):
        p.result(timeout=0.0)
    assert p.set_running_or_notify_cancel() and p.running()
    threading.Timer(0.05, p.set_result, (42,)).start()
    assert p.result(timeout=5.0) == 42 and p.done() and not p.running()
    assert p.result(timeout=0.0) == 42, "asked again: the same value at once"


def test_an_exception_is_raised_in_the_waiting_thread():
    p = Pass()
    p.set_running_or_notify_cancel()
    p.set_exception(ZeroDivisionError("boom"))
    with pytest.raises(ZeroDivisionError):
        p.result(timeout=0.0)


def test_done_callbacks_run_once_when_the_call_ends_or_at_once_when_it_has():
    p, seen = Pass(), []
    p.add_done_callback(lambda f: seen.append(("early", f.result(timeout=0.0))))
    assert seen == []
    p.set_result(1)
    p.set_result(2)  # a second end changes nothing (the lock is released once)
    assert seen == [("early", 1)]
    p.add_done_callback(lambda f: seen.append(("late", f.result(timeout=0.0))))
    assert seen == [("early", 1), ("late", 1)]


def test_a_failing_callback_is_not_raised_in_the_worker_and_the_others_run():
    p, seen = Pass(), []
    p.add_done_callback(lambda f: 1 / 0)
    p.add_done_callback(lambda f: seen.append(f.done()))
    p.set_result(None)
    assert seen == [True] and p.result(timeout=0.0) is None
