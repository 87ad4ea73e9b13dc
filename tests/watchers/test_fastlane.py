"""The fast lane: between 2 s ticks it watches only the inputs near their thresholds (and the GPUs drawing
more than their limit) and answers a crossing at once with the safety layer's own action, journal first."""

from __future__ import annotations

import asyncio

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.sysfs import SysfsIO
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.watchers.fastlane import FastLane, FastLaneOptions

from .conftest import AMDGPU, GPU_DUMPS, NCT, NO_HANG_S, make_tick, read, settings_for, write

EDGE = "hwmon:amdgpu-pci-0700/temp1"
AMD_PWM = "hwmon:amdgpu-pci-0700/pwm1"


class CountingIO(SysfsIO):
    def __init__(self):
        self.preads = 0

    def pread(self, fd, size):
        self.preads += 1
        return super().pread(fd, size)


def lane_for(tick, emitted, clock, **kw):
    return FastLane(lambda: tick, asyncio.Lock(), emitted.extend, FastLaneOptions(**kw), clock=clock)


@pytest.fixture
def board(tmp_path, root, policy_dir, clock):
    io = CountingIO()
    tick = make_tick(settings_for(tmp_path, root, policy_dir, tick_s=2.0), [HwmonBackend(str(root), io=io)],
                       clock)
    yield tick, io
    tick.executor.worker.shutdown()


async def test_nothing_near_a_threshold_means_nothing_is_read(board, clock):
    tick, io = board
    lane = lane_for(tick, [], clock)
    lane.rearm(await tick.run(1))  # edge at 39 °C, its trigger 86 °C (crit 91 − 5)
    before = io.preads
    assert lane.watch == {}
    assert await lane.poll_once() is False
    assert io.preads == before and lane.polls == 0


async def test_an_input_that_cools_off_is_no_longer_watched_and_its_descriptor_is_closed(board, clock, root):
    tick, io = board
    lane = lane_for(tick, [], clock)
    write(root, f"{AMDGPU}/temp1_input", 80000)  # within 10 °C of its trigger
    lane.rearm(await tick.run(1))
    await lane.poll_once()
    assert lane.watch == {EDGE: 86.0} and set(lane._hwmon) == {EDGE}
    write(root, f"{AMDGPU}/temp1_input", 60000)  # 26 °C under: nothing to watch
    lane.rearm(await tick.run(2))  # (a drop that fast is held one reading by the sensor trust)
    lane.rearm(await tick.run(3))
    assert lane.watch == {} and lane._hwmon == {} and not lane._armed.is_set()
    lane.rearm(await tick.run(4))  # and again from nothing to nothing
    before = io.preads
    assert lane.watch == {} and await lane.poll_once() is False and io.preads == before


async def test_a_crossing_between_ticks_gets_the_safety_action_journal_first(board, clock, root):
    tick, io = board
    emitted = []
    lane = lane_for(tick, emitted, clock)
    original_amd = read(root, f"{AMDGPU}/pwm1")
    write(root, f"{AMDGPU}/temp1_input", 80000)  # within 10 °C of the trigger: watched
    lane.rearm(await tick.run(1))
    assert lane.watch == {EDGE: 86.0}
    assert await lane.poll_once() is False  # 80 °C: nothing to do (the first poll opens the file)
    before = io.preads
    assert await lane.poll_once() is False
    assert io.preads == before + 1  # one pread of one file, nothing else
    write(root, f"{AMDGPU}/temp1_input", 90000)
    assert await lane.poll_once() is True
    # the GPU chip's own fan and every board fan whose curve reads the edge sensor: full, manual mode
    assert read(root, f"{AMDGPU}/pwm1") == 255 and read(root, f"{AMDGPU}/pwm1_enable") == 1
    assert all(read(root, f"{NCT}/pwm{i}") == 255 for i in range(1, 7))
    journal = tick.applier.journal.entries()
    assert journal[AMD_PWM].saved["pwm"] == original_amd  # the original, recorded before the write
    assert emitted[0].kind == "fault" and emitted[0].subject == EDGE and "90 °C ≥ 86 °C" in emitted[0].message
    assert {e.subject for e in emitted if e.kind == "actuation"} >= {AMD_PWM, "hwmon:nct6798-isa-0290/pwm3"}
    # acted once: the next polls leave it to the main tick, which latches the same safety decision
    assert await lane.poll_once() is False
    snap = await tick.run(2)
    assert snap.decisions[AMD_PWM].rule == "safety/critical-temperature"
    lane.rearm(snap)
    assert lane.acted == {EDGE}  # still critical at the tick: the tick's safety layer has it, not the lane
    actions = lane.actions
    assert await lane.poll_once() is False and lane.actions == actions
    write(root, f"{AMDGPU}/temp1_input", 82000)  # cooled below the trigger: the next crossing counts again
    lane.rearm(await tick.run(3))
    assert lane.acted == set() and lane.watch == {EDGE: 86.0}


async def test_the_lane_acts_within_100_ms_of_a_crossing_with_a_2_s_tick(board, clock, root):
    tick, _ = board
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane = lane_for(tick, [], clock)  # the default rate, 12.5 Hz
    lane.rearm(await tick.run(1))
    start = clock.monotonic()
    cross_at = start + 0.137  # somewhere between two polls, long before the next 2 s tick
    acted_at = None

    async def sleep(seconds):  # the clock moves only here; files change at their simulated instant
        nonlocal acted_at
        if acted_at is None and lane.actions:
            acted_at = clock.monotonic()  # the poll that acted ran at this instant
        clock.advance(seconds)
        if clock.monotonic() >= cross_at:
            write(root, f"{AMDGPU}/temp1_input", 95000)
        await asyncio.sleep(0)

    lane.sleep = sleep
    task = asyncio.create_task(lane.run())
    while acted_at is None and clock.monotonic() < start + 2.0:
        await asyncio.sleep(0)
    await lane.stop()
    await task
    assert acted_at is not None and read(root, f"{AMDGPU}/pwm1") == 255
    assert 0 <= acted_at - cross_at <= 0.1


async def test_paused_the_lane_neither_reads_nor_writes(tmp_path, root, policy_dir, clock):
    io = CountingIO()
    tick = make_tick(settings_for(tmp_path, root, policy_dir, tick_s=2.0), [HwmonBackend(str(root), io=io)],
                       clock)
    paused = True
    lane = FastLane(lambda: tick, asyncio.Lock(), [].extend, clock=clock, paused=lambda: paused)
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane.rearm(await tick.run(1))
    write(root, f"{AMDGPU}/temp1_input", 95000)
    before = io.preads
    assert await lane.poll_once() is False
    assert io.preads == before and read(root, f"{AMDGPU}/pwm1") != 255
    tick.executor.worker.shutdown()


@pytest.fixture
def gpus(tmp_path, root, policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    tick = make_tick(settings_for(tmp_path, root, policy_dir, tick_s=2.0), [backend], clock)
    yield fake, tick
    tick.executor.worker.shutdown()
    backend.close()


async def test_a_gpu_over_its_limit_is_watched_and_its_crossing_cuts_it_and_sends_fans_full(gpus, clock):
    fake, tick = gpus
    emitted = []
    lane = lane_for(tick, emitted, clock)
    snap = await tick.run(1)  # the policy: limits at 80 %, fans at 40 %
    limit0, limit1 = fake.power_limit_w(0), fake.power_limit_w(1)
    lane.rearm(snap)
    assert lane.watch == {}  # cool and under their limits
    fake.set_dynamic(0, power_draw_w=limit0 + 40.0)  # gpu0 draws more than its limit, at 40 °C
    lane.rearm(await tick.run(2))
    trigger = tick.state.safety.triggers
    assert set(lane.watch) == {"gpu0/temperature"} and lane.watch["gpu0/temperature"] == dict(trigger)[
        "gpu0/temperature"] == 95.0 - 5.0
    fake.set_dynamic(0, temp_c=93.0)
    assert await lane.poll_once() is False  # 40 → 93 °C at once: faster than a GPU moves, confirmed next poll
    assert await lane.poll_once() is True
    knobs = {k.id: k for d in tick.world.devices for k in d.knobs}
    # 3 °C over its trigger: 40 % under what it drew (proportional, policy/safety_latch.py), above the minimum;
    # it drew 40 W over its limit, so 40 % under the limit in force, never from above it (attack8 T1)
    assert fake.power_limit_w(0) == pytest.approx(0.6 * limit0, abs=0.01)
    assert fake.power_limit_w(0) > knobs["gpu0/power_limit"].min == 100.0
    assert fake.fan_target_pct(0, 0) == 100 and not fake.fan_auto(0, 0)
    assert fake.power_limit_w(1) == limit1 and fake.fan_target_pct(1, 0) == 40  # the other GPU untouched
    assert "gpu0/power_limit" in tick.applier.journal
    assert emitted[0].subject == "gpu0/temperature"


@pytest.mark.parametrize("ahead_s", [0.0, 1e6])
async def test_the_threaded_lane_reads_in_its_thread_and_acts_on_the_loop(board, clock, root, ahead_s):
    """Real time: the polling thread reads the watched file and hands the crossing to the event loop, which
    applies the safety action (journal first). Bounded wait, no timing assertion (speed: the benchmark).
    The thread's quiet time is on its own clock, whatever the tick's clock reads (here 11 days ahead)."""
    import threading

    tick, _ = board
    clock.advance(ahead_s)
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane = lane_for(tick, [], clock, threaded=True)
    lane.rearm(await tick.run(1))
    loop_thread = threading.current_thread()
    acted_on = []
    real_poll = lane.poll_once

    async def poll_once():
        acted_on.append(threading.current_thread())
        return await real_poll()

    lane.poll_once = poll_once
    thread = lane.start_thread(asyncio.get_running_loop())
    try:
        for _ in range(50):  # quiet: the thread reads, nothing is handed to the loop
            await asyncio.sleep(0.01)
        assert acted_on == [] and read(root, f"{AMDGPU}/pwm1") != 255
        write(root, f"{AMDGPU}/temp1_input", 95000)
        for _ in range(500):
            if read(root, f"{AMDGPU}/pwm1") == 255:
                break
            await asyncio.sleep(0.01)
        assert read(root, f"{AMDGPU}/pwm1") == 255 and read(root, f"{AMDGPU}/pwm1_enable") == 1
        assert acted_on and all(t is loop_thread for t in acted_on)
        assert AMD_PWM in tick.applier.journal.entries()
    finally:
        await lane.stop()
        await asyncio.to_thread(thread.join, 2.0)
    assert not thread.is_alive()


def test_the_daemon_polls_from_a_thread_in_real_time():
    from aithermd.settings import DaemonSettings
    from aithermd.watchers.options import WatcherOptions

    options = WatcherOptions.for_daemon(DaemonSettings(tick_s=1.0, bus="none"), real_time=True)
    assert options.fastlane is not None and options.fastlane.threaded
    assert WatcherOptions.for_daemon(DaemonSettings(tick_s=1.0, bus="none"), real_time=False).fastlane is None


async def test_a_spike_across_the_trigger_waits_for_the_next_poll(board, clock, root):
    """80 → 120 °C between two polls is faster than a GPU die moves (30 °C/s): the lane, like the tick's
    sensor trust, acts only if the next poll still reads it — a one-poll spike never moves a fan."""
    tick, _ = board
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane = lane_for(tick, [], clock)
    lane.rearm(await tick.run(1))
    original = read(root, f"{AMDGPU}/pwm1")
    write(root, f"{AMDGPU}/temp1_input", 120000)
    assert await lane.poll_once() is False  # suspected spike
    write(root, f"{AMDGPU}/temp1_input", 81000)
    assert await lane.poll_once() is False  # it was one: dropped
    assert read(root, f"{AMDGPU}/pwm1") == original
    write(root, f"{AMDGPU}/temp1_input", 120000)
    assert await lane.poll_once() is False
    assert await lane.poll_once() is True  # still there one poll later: real, acted on
    assert read(root, f"{AMDGPU}/pwm1") == 255


async def test_nothing_is_read_before_a_watched_input_could_reach_its_trigger(board, clock, root):
    """80 °C under an 86 °C trigger on an amdgpu sensor (30 °C/s at most, the sensor trust's limit): it
    cannot be at its trigger before 0.2 s, so the first poll comes one period (80 ms) before that, then one
    every period; at its trigger already, the lane polls at once."""
    tick, io = board
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane = lane_for(tick, [], clock)
    snap = await tick.run(1)
    lane.rearm(snap)
    assert lane.quiet_until == pytest.approx(snap.t_mono + 6.0 / 30.0 - 0.08)
    polled_at = []
    real_poll = lane.poll_once

    async def poll_once():
        polled_at.append(clock.monotonic() - snap.t_mono)
        return await real_poll()

    async def sleep(seconds):
        clock.advance(seconds)
        await asyncio.sleep(0)

    lane.poll_once, lane.sleep = poll_once, sleep
    task = asyncio.create_task(lane.run())
    while len(polled_at) < 3:
        await asyncio.sleep(0)
    await lane.stop()
    await task
    assert polled_at[:3] == pytest.approx([0.12, 0.20, 0.28])
    write(root, f"{AMDGPU}/temp1_input", 86000)
    snap = await tick.run(2)
    lane.rearm(snap)
    assert lane.quiet_until <= snap.t_mono  # no headroom: no quiet time


def test_each_poll_of_the_thread_starts_the_quiet_time_again_from_its_readings(board, clock, root):
    """The thread read 80 °C under an 86 °C trigger (30 °C/s at most): no poll for the next 0.2 s less a
    period, whatever the tick said."""
    import time

    tick, _ = board
    write(root, f"{AMDGPU}/temp1_input", 85000)
    lane = lane_for(tick, [], clock, threaded=True)
    lane.rearm(asyncio.run(tick.run(1)))
    write(root, f"{AMDGPU}/temp1_input", 80000)  # cooler since the tick
    before = time.monotonic()
    assert lane._crossed() is False
    assert before + 6.0 / 30.0 - 0.08 <= lane._quiet_rt <= time.monotonic() + 6.0 / 30.0 - 0.08
    write(root, f"{AMDGPU}/temp1_input", 86000)
    assert lane._crossed() is True  # at its trigger: handed to the loop at once


def test_the_thread_reads_a_watched_gpu_itself_and_waits_out_its_headroom(gpus, clock):
    """A GPU drawing more than its limit is watched whatever its temperature; the polling thread reads it
    (one job on the NVML worker, no hand-off to the loop) and, 30 °C under its 90 °C trigger (an NVML GPU
    rises 20 °C/s at most), polls it again only 1.5 s less a period later; at its trigger it hands over at
    once."""
    import time

    fake, tick = gpus
    lane = lane_for(tick, [], clock, threaded=True, nvml_timeout_s=5.0)
    asyncio.run(tick.run(1))
    fake.set_dynamic(0, power_draw_w=fake.power_limit_w(0) + 40.0, temp_c=75.0)
    clock.advance(2.0)
    lane.rearm(asyncio.run(tick.run(2)))
    assert set(lane.watch) == {"gpu0/temperature"} and lane.watch["gpu0/temperature"] == 90.0
    fake.set_dynamic(0, temp_c=60.0)  # cooler since the tick
    before = time.monotonic()
    assert lane._crossed() is False
    assert before + 30.0 / 20.0 - 0.08 <= lane._quiet_rt <= time.monotonic() + 30.0 / 20.0 - 0.08
    assert lane.polls == 0  # nothing handed to the loop
    fake.set_dynamic(0, temp_c=90.0)
    assert lane._crossed() is True


async def test_an_nvml_gpu_5_c_under_its_trigger_is_not_read_for_170_ms_then_read_at_12_5_hz(gpus, clock):
    """An NVML GPU is paced by its own rise rate (20 °C/s, plausible.RISE_C_S_NVML), not the 30 °C/s spike
    limit: 85 °C under a 90 °C trigger cannot be there before 0.25 s, so the first read comes one period
    (80 ms) before that, at 0.17 s, then one every period (12.5 Hz); the spike check still uses 30 °C/s."""
    fake, tick = gpus
    lane = lane_for(tick, [], clock)
    await tick.run(1)
    fake.set_dynamic(0, power_draw_w=fake.power_limit_w(0) + 40.0, temp_c=85.0)
    clock.advance(2.0)
    snap = await tick.run(2)
    lane.rearm(snap)
    assert lane.watch == {"gpu0/temperature": 90.0}
    assert lane._pace == {"gpu0/temperature": 20.0} and lane._jump == {"gpu0/temperature": 30.0}
    assert lane.quiet_until == pytest.approx(snap.t_mono + 5.0 / 20.0 - 0.08)
    polled_at = []
    real_poll = lane.poll_once

    async def poll_once():
        polled_at.append(clock.monotonic() - snap.t_mono)
        return await real_poll()

    async def sleep(seconds):
        clock.advance(seconds)
        await asyncio.sleep(0)

    lane.poll_once, lane.sleep = poll_once, sleep
    task = asyncio.create_task(lane.run())
    while len(polled_at) < 3:
        await asyncio.sleep(0)
    await lane.stop()
    await task
    assert polled_at[:3] == pytest.approx([0.17, 0.25, 0.33])


def test_the_thread_waits_once_per_poll_until_its_headroom_allows_a_read(board, clock, root, monkeypatch):
    """80 °C under an 86 °C amdgpu trigger (30 °C/s): each poll of the thread is followed by one wait of
    0.2 s less a period (0.12 s) straight to the next poll, not a period and then the rest (a wake-up saved
    per poll). Fake time: the thread's clock moves only by its waits."""
    from aithermd.watchers import fastlane

    class FakeTime:
        t = 5000.0

        def monotonic(self):
            return self.t

    fake_time = FakeTime()
    monkeypatch.setattr(fastlane, "time", fake_time)
    tick, io = board
    write(root, f"{AMDGPU}/temp1_input", 80000)
    lane = lane_for(tick, [], clock, threaded=True)
    lane.rearm(asyncio.run(tick.run(1)))
    waits, reads = [], []

    class Wake:
        def wait(self, timeout=None):
            waits.append(timeout)
            reads.append(io.preads)
            fake_time.t += timeout
            lane._stopped = len(waits) >= 4
            return False

        def set(self):
            pass

        def clear(self):
            pass

    lane._wake = Wake()
    start = io.preads
    lane._thread_main(None)
    assert waits == pytest.approx([0.12, 0.12, 0.12, 0.12])
    assert reads[0] == start and all(b > a for a, b in zip(reads, reads[1:], strict=False))  # a read a wait


def test_the_thread_neither_reads_nor_paces_by_an_input_already_acted_on(board, clock, root):
    """At its trigger in the tick, the tick's safety layer acted and the lane will not act on it again
    before the next re-arm: the thread does not read it, and with nothing else watched it waits for the
    re-arm (IDLE_S) instead of polling it at 12.5 Hz; the re-arm after it cooled paces it again."""
    import time

    from aithermd.watchers.fastlane import IDLE_S

    tick, io = board
    write(root, f"{AMDGPU}/temp1_input", 86000)  # the amdgpu trigger: 91 − 5 °C
    lane = lane_for(tick, [], clock, threaded=True)
    lane.rearm(asyncio.run(tick.run(1)))
    assert lane.acted == {EDGE} and set(lane.watch) == {EDGE}
    reads = io.preads
    assert lane._crossed() is False
    assert io.preads == reads
    assert lane._quiet_rt >= time.monotonic() + IDLE_S - 0.08 - 1.0
    write(root, f"{AMDGPU}/temp1_input", 80000)
    clock.advance(2.0)
    lane.rearm(asyncio.run(tick.run(2)))
    assert lane.acted == set()
    assert lane._crossed() is False and io.preads > reads
    assert lane._quiet_rt <= time.monotonic() + 6.0 / 30.0


def test_the_thread_reads_gpu_temperatures_itself_without_a_job_on_the_nvml_worker(gpus, clock, monkeypatch):
    """The polling thread's GPU reads are one NVML call each on its own thread (lanegpus.DirectReads): no
    hand-off to the backend's worker, whose thread would wake for each poll."""
    fake, tick = gpus
    lane = lane_for(tick, [], clock, threaded=True)
    asyncio.run(tick.run(1))
    fake.set_dynamic(0, power_draw_w=fake.power_limit_w(0) + 40.0, temp_c=75.0)
    clock.advance(2.0)
    lane.rearm(asyncio.run(tick.run(2)))
    worker = lane._nvml["gpu0/temperature"].worker

    def no_hop(*_a, **_k):
        raise AssertionError("a job on the NVML worker")

    monkeypatch.setattr(worker, "_current", no_hop)
    asked = fake.calls.get("nvmlDeviceGetTemperatureV", 0) + fake.calls.get("nvmlDeviceGetTemperature", 0)
    assert lane._crossed() is False
    assert fake.calls.get("nvmlDeviceGetTemperatureV", 0) + fake.calls.get("nvmlDeviceGetTemperature", 0) \
        == asked + 1
    fake.set_dynamic(0, temp_c=90.0)
    assert lane._crossed() is True


async def test_a_gpu_whose_read_hangs_in_the_thread_is_left_out_by_a_fresh_thread(gpus, clock):
    """gpu0's NVML calls block while the thread reads it: at the next re-arm, past the read deadline, the
    lane marks it stuck and starts a fresh thread, which goes on reading gpu1; once gpu0's call returns the
    stuck thread ends and gpu0 is read again. Bounded waits, no timing assertion."""
    fake, tick = gpus
    lane = lane_for(tick, [], clock, threaded=True)
    await tick.run(1)
    for i in (0, 1):
        fake.set_dynamic(i, power_draw_w=fake.power_limit_w(i) + 40.0, temp_c=75.0)
    clock.advance(2.0)
    snap = await tick.run(2)
    lane.rearm(snap)
    assert set(lane.watch) == {"gpu0/temperature", "gpu1/temperature"}
    for reader in lane._nvml.values():
        reader.deadline_s = 0.05
    fake.hang(0)
    first = lane.start_thread(asyncio.get_running_loop())
    try:
        for _ in range(500):
            if lane._gpus.overdue(lane._generation, 0.05) == "gpu0":
                break
            await asyncio.sleep(0.01)
        assert lane._gpus.stuck == {"gpu0"}
        lane.rearm(snap)  # the stuck thread is replaced
        assert lane._generation == 2 and lane._thread is not first and lane._thread.is_alive()
        temps = lane._gpus.temperatures(dict(lane._nvml))  # what the fresh thread reads meanwhile
        assert temps == {"gpu0/temperature": None, "gpu1/temperature": 75.0}
        assert first.is_alive()  # still in gpu0's call
    finally:
        fake.unhang(0)
    await asyncio.to_thread(first.join, 5.0)
    assert not first.is_alive() and lane._gpus.stuck == set()
    assert lane._gpus.temperatures(dict(lane._nvml)) == {"gpu0/temperature": 75.0, "gpu1/temperature": 75.0}
    await lane.stop()


def test_the_thread_reads_no_gpu_while_the_worker_renews_nvml_handles(gpus, clock):
    """nvmlShutdown drops every handle: the worker holds the backend's handles exclusively around every
    shutdown, init and new handle (here a maintenance), and the thread's own reads skip a poll meanwhile
    (unknown: it polls again a period later) rather than use a dropped handle."""
    fake, tick = gpus
    lane = lane_for(tick, [], clock, threaded=True)
    asyncio.run(tick.run(1))
    fake.set_dynamic(0, power_draw_w=fake.power_limit_w(0) + 40.0, temp_c=75.0)
    clock.advance(2.0)
    lane.rearm(asyncio.run(tick.run(2)))
    backend = tick.world.device_owner["gpu0"]
    seen = []
    backend.life.due = lambda t: True
    backend.life.maintain = lambda t: seen.append(backend.handles.changing)
    backend.sample()
    assert seen == [True] and not backend.handles.changing
    readers = dict(lane._nvml)
    asked = fake.calls.get("nvmlDeviceGetTemperatureV", 0) + fake.calls.get("nvmlDeviceGetTemperature", 0)
    with backend.handles.exclusive(0.0):
        assert lane._gpus.temperatures(readers) == {"gpu0/temperature": None}
    assert fake.calls.get("nvmlDeviceGetTemperatureV", 0) + fake.calls.get("nvmlDeviceGetTemperature", 0) \
        == asked
    assert lane._gpus.temperatures(readers) == {"gpu0/temperature": 75.0}
