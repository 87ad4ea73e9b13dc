"""Writes in flight at stop: the final restore waits for every one of them with a deadline; a write that
has not returned by then is abandoned, its knob restored last and again once the write returned, so the
restore wins. The writes hang in a blocking (NVML-like) backend: one from the fast lane, one from the
resume re-apply."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import restore_journal
from aithermd.runtime.daemon import Daemon
from aithermd.watchers.fastlane import FastLane, FastLaneOptions
from aithermd.watchers.options import WatcherOptions
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE

ORIGINAL = ({"pwm1": 100, "pwm2": 100}, {"pwm1": 2, "pwm2": 2})


class GatedGpu(FakeBackend):
    """A fake read and written off the loop (like NVML) whose writes to ``hang`` block inside the backend
    call until ``gate`` opens; its temperatures have an NVML-like reader for the fast lane."""

    blocking = True

    def __init__(self) -> None:
        super().__init__("amdgpu", start_pwm=100, start_enable=2)  # a GPU chip: its fans go to full
        self.gate = threading.Event()
        self.gate.set()
        self.hang: set[str] = set()
        self.entered = threading.Event()  # a write is blocked inside the call
        self.landed = threading.Event()  # the blocked write has returned
        self.release_on_restore: str | None = None  # open the gate right after restoring this knob

    def write_knob(self, knob_id: str, value: float) -> None:
        if knob_id.rsplit("/", 1)[1] in self.hang and not self.gate.is_set():
            self.entered.set()
            self.gate.wait(30)
            super().write_knob(knob_id, value)
            self.landed.set()
            return
        super().write_knob(knob_id, value)

    def restore_knob(self, knob_id: str, saved: dict) -> None:
        super().restore_knob(knob_id, saved)
        if knob_id == self.release_on_restore:  # the worst moment: the hung write lands just after ours
            self.gate.set()
            assert self.landed.wait(10)

    def reader(self, channel_id: str):
        gpu, name = self, channel_id.rsplit("/", 1)[1]

        class Reader:
            async def aread(self, timeout_s: float):
                return gpu.temps[name], None

        return Reader() if name in self.temps else None


def daemon(settings, clock, gpu, **live) -> Daemon:
    return Daemon(settings, clock=clock, backends=[gpu], sleep=clock.sleep, engine=STUB_ENGINE,
                  watchers=WatcherOptions(**live), stop_timeout_s=0.2)


def fast_lane_hang(d: Daemon, gpu: GatedGpu, tasks: list):
    """A step that, once the tick took the fans, makes a temperature cross its trigger between ticks: the
    fast lane's safety write (fans to full) hangs in the backend; the daemon is stopped meanwhile."""
    def step() -> bool:
        seq = d.hub.latest.seq
        if seq == 1:
            gpu.temps["temp1"] = 86.0  # within 10 °C of its trigger (crit 95 − 5): watched after tick 3
        if seq == 3:  # a jump that large is held one reading by the sensor trust; tick 3 confirms it
            lane = FastLane(lambda: d.tick, d.tick.lock, lambda events: None,
                            FastLaneOptions(apply_timeout_s=0.05), clock=d.clock)
            lane.rearm(d.hub.latest)
            assert lane.watch == {gpu.kid("temp1"): 90.0}
            gpu.temps["temp1"] = 96.0
            gpu.gate.clear()
            gpu.hang = {"pwm1", "pwm2"}
            tasks.append(asyncio.ensure_future(lane.poll_once()))
        return gpu.entered.is_set()

    return step


def resume_hang(d: Daemon, gpu: GatedGpu, tasks: list):
    """A step that suspends after the tick took the fans; the driver resets pwm1 meanwhile, and on resume
    the re-apply of pwm1 hangs in the backend; the daemon is stopped meanwhile."""

    def step() -> bool:
        seq = d.hub.latest.seq
        if seq == 1:
            tasks.append(asyncio.ensure_future(d.changes.suspend()))
        if seq == 3:
            assert d.tick.applier.paused
            gpu.pwm["pwm1"], gpu.enable["pwm1"] = 77, 2  # reset across the sleep
            gpu.gate.clear()
            gpu.hang = {"pwm1"}
            tasks.append(asyncio.ensure_future(d.changes.resume()))
        return gpu.entered.is_set()

    return step


@pytest.mark.parametrize("path", [fast_lane_hang, resume_hang])
async def test_a_write_that_returns_after_the_final_restore_is_restored_again(settings, clock, path):
    gpu = GatedGpu()
    d = daemon(settings, clock, gpu, resume_timeout_s=0.05)
    tasks: list = []
    gpu.release_on_restore = gpu.kid("pwm1")
    assert await d.run(until=path(d, gpu, tasks)) == 0
    await asyncio.gather(*tasks)
    assert gpu.landed.is_set()  # the hung write did land, after the restore of its knob
    assert (gpu.pwm, gpu.enable) == ORIGINAL
    assert not Journal(settings.state_dir).dirty


@pytest.mark.parametrize("path", [fast_lane_hang, resume_hang])
async def test_a_write_that_never_returns_leaves_its_knob_journaled_for_aithermd_restore(settings, clock,
                                                                                         path):
    gpu = GatedGpu()
    d = daemon(settings, clock, gpu, resume_timeout_s=0.05)
    tasks: list = []
    try:
        assert await d.run(until=path(d, gpu, tasks)) == 1  # the knob may still change: not a clean stop
        await asyncio.gather(*tasks)
        assert gpu.pwm == ORIGINAL[0] and gpu.enable == ORIGINAL[1]  # restored, but ...
        assert list(Journal(settings.state_dir).entries()) == [gpu.kid("pwm1")]  # ... kept for later
    finally:
        gpu.gate.set()  # the driver answers at last, after the daemon is gone
    assert gpu.landed.wait(10) and gpu.pwm["pwm1"] != ORIGINAL[0]["pwm1"]
    report = restore_journal(Journal(settings.state_dir), backends=[gpu])  # ExecStopPost=aithermd restore
    assert report.ok and (gpu.pwm, gpu.enable) == ORIGINAL
    assert not Journal(settings.state_dir).dirty
