"""NvmlWorker: one thread owns every NVML call; deadlines; re-entrant calls; closing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aithermd.backends.nvml_worker import NvmlWorker
from aithermd.errors import BackendTimeout


@pytest.fixture
def worker():
    w = NvmlWorker(name="nvml-test")
    yield w
    w.close()


def test_calls_run_on_one_thread_in_order(worker):
    names = {worker.run(lambda: threading.current_thread().name) for _ in range(5)}
    assert len(names) == 1 and names.pop().startswith("nvml-test")
    order: list[int] = []
    for i in range(5):
        worker.run(order.append, i)
    assert order == [0, 1, 2, 3, 4]


def test_a_call_from_the_worker_runs_at_once(worker):
    assert worker.run(lambda: worker.run(lambda: 7) + 1) == 8
    assert not worker.on_worker


def test_errors_propagate(worker):
    with pytest.raises(ZeroDivisionError):
        worker.run(lambda: 1 / 0)


def test_a_blocked_call_misses_its_deadline(worker):
    gate = threading.Event()
    with pytest.raises(BackendTimeout, match="took over"):
        worker.run(gate.wait, timeout_s=0.05)
    gate.set()
    assert worker.run(lambda: "free again") == "free again"


async def test_await_from_the_loop(worker):
    loop_thread = threading.current_thread().name
    name = await worker.call(lambda: threading.current_thread().name)
    assert name != loop_thread and name.startswith("nvml-test")
    gate = threading.Event()
    with pytest.raises(BackendTimeout):
        await worker.call(gate.wait, timeout_s=0.05)
    gate.set()
    assert await asyncio.wait_for(worker.call(lambda: 3), 5) == 3


def test_closed_worker_refuses():
    w = NvmlWorker()
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.run(lambda: None)


def _until(predicate, tries=500):
    """Wait (bounded, 10 ms steps) for ``predicate``; no timing is asserted."""
    import time

    for _ in range(tries):
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_poll_reads_every_gpu_in_one_job_on_the_worker(worker):
    threads = []

    def temp(item):
        threads.append(threading.current_thread().name)
        return item * 10

    assert worker.poll([("gpu0", 1), ("gpu1", 2)], temp, wait_s=5.0) == {"gpu0": 10, "gpu1": 20}
    assert len(set(threads)) == 1 and threads[0].startswith("nvml-test")


def test_a_poll_behind_a_busy_thread_gives_up_waiting_without_calling_a_gpu_hung(worker):
    """The worker is busy with something else (the tick's pass): the poll's wait is cut short, nothing is
    marked hung, no second poll queues behind the first, and the first one's job still runs."""
    gate = threading.Event()
    busy = threading.Thread(target=worker.run, args=(gate.wait,), kwargs={"timeout_s": 30.0})
    busy.start()
    try:
        _until(lambda: worker._executor is not None)
        seen = []
        assert worker.poll([("gpu0", 1)], seen.append, wait_s=0.01, deadline_s=0.01) is None
        assert worker.poll([("gpu0", 2)], seen.append, wait_s=0.01, deadline_s=0.01) is None
        assert worker.hung_gpus == frozenset() and worker.hangs == 0
    finally:
        gate.set()
        busy.join(5.0)
    assert _until(lambda: seen == [1])  # the first poll's job ran; the second never queued
    assert worker.poll([("gpu0", 3)], lambda x: x, wait_s=5.0) == {"gpu0": 3}


def test_a_gpu_that_hangs_in_a_poll_is_marked_hung_and_the_others_are_read_on_a_fresh_thread(worker):
    gate = threading.Event()
    reading = threading.Event()

    def temp(item):
        if item == "stuck":
            reading.set()
            gate.wait()
        return item

    try:
        assert worker.poll([("gpu0", "stuck"), ("gpu1", "ok")], temp, wait_s=0.01, deadline_s=0.05) is None
        assert reading.wait(5.0)
        assert _until(lambda: worker.poll([("gpu1", "ok")], temp, 5.0, 0.05) is not None, tries=100)
        assert worker.hung("gpu0") is not None and worker.hung("gpu1") is None
        # the hung GPU is left out of later polls (and of the tick's reads) until its call returns
        assert worker.poll([("gpu0", "stuck"), ("gpu1", "ok")], temp, wait_s=5.0) == {"gpu1": "ok"}
    finally:
        gate.set()
    assert _until(lambda: worker.hung("gpu0") is None)


def test_a_poll_queued_behind_a_call_that_is_left_behind_moves_to_the_fresh_thread(worker):
    """A call on gpu0 hangs and its thread is left behind (the GPU marked hung): a poll waiting behind it
    is not cancelled (it was, and answered None) but moves to the fresh thread and reads gpu1; the next
    one leaves the hung GPU out."""
    gate = threading.Event()
    busy = threading.Thread(target=lambda: pytest.raises(BackendTimeout, worker.run, gate.wait, timeout_s=0.3,
                                                         gpu="gpu0"))
    busy.start()
    try:
        _until(lambda: worker._executor is not None)
        answers = []
        poller = threading.Thread(target=lambda: answers.append(worker.poll([("gpu1", 1)], str, 30.0)))
        poller.start()
        poller.join(10.0)
        busy.join(10.0)
        assert answers == [{"gpu1": "1"}] and worker.hung("gpu0") is not None
        assert worker.poll([("gpu0", 0), ("gpu1", 1)], str, wait_s=5.0) == {"gpu1": "1"}
    finally:
        gate.set()
