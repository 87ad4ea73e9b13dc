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
