"""Blocking backends (NVML) are read off the loop in the read guard's pass (the one hand-off of a tick) and
written in the worker thread; a hung one never stalls the loop."""

from __future__ import annotations

import asyncio
import threading

from aithermd.model import Status
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


class BlockingBackend(FakeBackend):
    kind = "nvml"
    blocking = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()

    def sample(self):
        self.threads.add(threading.current_thread().name)
        self.gate.wait()
        return super().sample()

    def write_knob(self, knob_id, value):
        self.threads.add(threading.current_thread().name)
        super().write_knob(knob_id, value)


async def test_blocking_backends_are_sampled_and_written_off_the_loop(settings, clock):
    gpu = BlockingBackend("gpu")
    board = FakeBackend("board")
    d = Daemon(settings, clock=clock, backends=[board, gpu], sleep=clock.sleep, engine=STUB_ENGINE)
    assert await d.run(max_ticks=2) == 0
    assert gpu.threads == {"aithermd-reads", "aithermd-worker_0"}  # read in the guard's pass, written after
    assert len(gpu.writes) == 2 and len(board.writes) == 2
    assert gpu.pwm == {"pwm1": 100, "pwm2": 100}  # restored


async def test_a_threaded_knob_decided_again_at_the_value_it_holds_costs_no_worker_hop(settings, clock,
                                                                                          monkeypatch):
    """The stub engine decides every fan every tick; after the first tick's writes the read-back shows them
    in place, and the loop does not hand the GPU's knobs to the worker thread only to find that out."""
    from aithermd.actuate.worker import Worker

    hops = []
    real = Worker.hop

    async def counted(self, fn, *args, **kw):
        hops.append(getattr(fn, "__name__", "?"))
        return await real(self, fn, *args, **kw)

    monkeypatch.setattr(Worker, "hop", counted)
    gpu = BlockingBackend("gpu")
    board = FakeBackend("board")
    d = Daemon(settings, clock=clock, backends=[board, gpu], sleep=clock.sleep, engine=STUB_ENGINE)
    assert await d.run(max_ticks=5) == 0
    assert hops == ["_batch"]  # the first tick's writes; nothing for the four ticks that change nothing
    assert [k for k, _ in gpu.writes] == [gpu.kid("pwm1"), gpu.kid("pwm2")]
    assert gpu.pwm == {"pwm1": 100, "pwm2": 100}  # restored


async def test_a_hung_blocking_backend_is_failed_and_the_rest_runs_on(settings):
    gpu = BlockingBackend("gpu")
    board = FakeBackend("board")
    s = settings.replace(**{"tick_s": 0.05})
    d = Daemon(s, backends=[board, gpu], engine=STUB_ENGINE)
    snaps = []

    def step():
        snap = d.hub.latest
        snaps.append(snap)
        if snap.seq == 2:
            gpu.gate.clear()  # the next NVML call hangs
        if snap.seq >= 8:
            gpu.gate.set()  # it answers at last: the stop waits for it, then restores
            return True
        return False

    task = asyncio.create_task(d.run(until=step))
    done, _ = await asyncio.wait({task}, timeout=30)
    gpu.gate.set()
    assert done and task.result() == 0
    hung = snaps[-1]
    assert hung.readings[gpu.kid("temp1")].status is Status.FAILED
    assert "no answer" in hung.readings[gpu.kid("temp1")].detail
    assert hung.readings[board.kid("temp1")].status is Status.OK
    busy = [e for e in d.hub.recent_events() if "worker thread busy" in e.message]
    assert len(busy) == 1
    assert board.pwm == {"pwm1": 100, "pwm2": 100} and gpu.pwm == {"pwm1": 100, "pwm2": 100}
