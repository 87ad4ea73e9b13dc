"""Hotplug without udev: which events rediscover what, settling, the monitor's supervisor, rediscovery that
keeps ids and forgets a vanished knob only once it is gone, and GPUs lost or removed from the fake NVML."""

from __future__ import annotations

import shutil

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.registry import ALL
from aithermd.runtime.changes import rediscover
from aithermd.runtime.daemon import Daemon
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.watchers.hotplug import DeviceEvent, Hotplug
from aithermd.watchers.options import WatcherOptions
from tests.support.clock import SimClock

from .conftest import AMDGPU, GPU_DUMPS, NO_HANG_S, make_tick, settings_for, write

AMD = "hwmon:amdgpu-pci-0700"


@pytest.mark.parametrize(("event", "family"), [
    (DeviceEvent("add", "hwmon", "/sys/devices/x/hwmon/hwmon3"), "hwmon"),
    (DeviceEvent("remove", "powercap", "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0"), "powercap"),
    (DeviceEvent("remove", "pci", "/sys/devices/pci0000:00/0000:41:00.0", "10de"), "nvml"),
    (DeviceEvent("add", "drm", "/sys/devices/pci0000:00/0000:41:00.0/drm/card1"), "nvml"),  # vendor unknown
    (DeviceEvent("add", "pci", "/sys/devices/pci0000:00/0000:05:00.0", "8086"), None),  # its hwmon event says
    (DeviceEvent("add", "drm", "/sys/devices/pci0000:00/0000:07:00.0/drm/card0", "1002"), None),
])
def test_which_family_an_event_rediscovers(event, family):
    assert event.family == family


def test_events_settle_and_a_remove_waits_until_the_directory_is_gone():
    clock = SimClock()
    present = {"/sys/devices/x/hwmon/hwmon3"}
    hp = Hotplug(monitor_factory=None, settle_s=0.2, clock=clock, exists=present.__contains__)
    hp.submit(DeviceEvent("add", "hwmon", "/sys/devices/y/hwmon/hwmon4"))
    hp.submit(DeviceEvent("add", "pci", "/sys/devices/pci0000:00/0000:05:00.0", "8086"))  # ignored
    assert hp.due() == set()  # not settled
    clock.advance(0.1)
    hp.submit(DeviceEvent("remove", "hwmon", "/sys/devices/x/hwmon/hwmon3"))
    clock.advance(0.15)
    assert hp.due() == set()  # the newest hwmon event is only 0.15 s old
    clock.advance(0.1)
    assert hp.due() == set()  # settled, but the removed directory is still there
    present.clear()
    assert hp.due() == {"hwmon"}
    assert hp.due() == set()  # taken


def test_a_remove_whose_directory_stays_is_applied_after_the_wait():
    clock = SimClock()
    hp = Hotplug(monitor_factory=None, settle_s=0.2, remove_wait_s=5.0, clock=clock, exists=lambda p: True)
    hp.submit(DeviceEvent("remove", "hwmon", "/sys/devices/x/hwmon/hwmon3"))
    clock.advance(1.0)
    assert hp.due() == set()
    clock.advance(4.5)
    assert hp.due() == {"hwmon"}


class DyingMonitor:
    made = 0

    def __init__(self, loop, on_event):
        DyingMonitor.made += 1
        self.alive, self.error = True, None

    def start(self):
        pass

    def stop(self):
        self.alive = False


async def test_a_failed_monitor_is_restarted_with_a_backoff_and_a_full_rescan():
    clock = SimClock()
    DyingMonitor.made = 0
    hp = Hotplug(monitor_factory=DyingMonitor, clock=clock, backoff_s=(1.0, 60.0))
    await hp.start()
    try:
        assert DyingMonitor.made == 1 and hp.check() is False
        hp.monitor.alive, hp.monitor.error = False, OSError(105, "ENOBUFS")
        assert hp.check() is False  # failure noticed, restart due in 1 s
        clock.advance(1.0)
        assert hp.check() is True and DyingMonitor.made == 2 and hp.restarts == 1
        clock.advance(hp.settle_s)
        assert hp.due() == {ALL}  # events were missed: rescan everything
        hp.monitor.alive = False
        hp.check()
        clock.advance(1.0)
        assert hp.check() is False  # the second failure waits twice as long
        clock.advance(1.0)
        assert hp.check() is True and hp.restarts == 2
    finally:
        await hp.stop()


def remove_amdgpu(root):
    shutil.rmtree(root / AMDGPU)
    (root / "class" / "hwmon" / "hwmon0").unlink()


async def test_rediscovery_keeps_ids_and_a_gone_knobs_original_for_its_return(tmp_path, root, policy_dir,
                                                                              clock):
    saved = tmp_path / "amdgpu"
    shutil.copytree(root / AMDGPU, saved, symlinks=True)
    tick = make_tick(settings_for(tmp_path, root, policy_dir), [HwmonBackend(str(root))], clock)
    try:
        write(root, f"{AMDGPU}/temp1_input", 95000)  # critical: the safety layer takes the amdgpu fan
        await tick.run(1)
        journal = tick.applier.journal
        assert f"{AMD}/pwm1" in journal and f"{AMD}/pwm1" in tick.applier.owned
        ids = [d.id for d in tick.world.devices]

        world, events = await rediscover(tick.world, {"hwmon"}, applier=tick.applier, t_wall=1.0)
        assert [d.id for d in world.devices] == ids and events == []  # nothing changed: nothing forgotten
        assert f"{AMD}/pwm1" in journal

        remove_amdgpu(root)
        world, events = await rediscover(world, {"hwmon"}, applier=tick.applier, t_wall=2.0)
        assert [d.id for d in world.devices] == [i for i in ids if i != AMD]
        assert [(e.kind, e.subject, e.data["action"]) for e in events] == [
            ("hotplug", AMD, "removed"), ("hotplug", f"{AMD}/pwm1", "forgotten")]
        assert f"{AMD}/pwm1" not in tick.applier.owned
        original = journal.entries()[f"{AMD}/pwm1"].saved  # kept for its return (attack6 G9)
        assert "hwmon:nct6798-isa-0290/pwm1" in journal  # the others stay

        shutil.copytree(saved, root / AMDGPU, symlinks=True)
        (root / "class" / "hwmon" / "hwmon0").symlink_to(f"../../{AMDGPU}")
        world, events = await rediscover(world, {"hwmon"}, applier=tick.applier, t_wall=3.0)
        assert [d.id for d in world.devices] == ids  # back, under the same id
        assert [(e.subject, e.data["action"]) for e in events] == [(AMD, "added")]
        tick.world = world
        await tick.run(2)  # taken again: its original is the one found before the daemon's first write
        assert f"{AMD}/pwm1" in tick.applier.owned and journal.entries()[f"{AMD}/pwm1"].saved == original
    finally:
        tick.executor.worker.shutdown()


@pytest.fixture
def two_gpus(tmp_path, root, policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    tick = make_tick(settings_for(tmp_path, root, policy_dir), [backend], clock)
    yield fake, tick
    tick.executor.worker.shutdown()
    backend.close()


async def test_a_removed_last_gpu_is_dropped_and_its_knobs_forgotten(two_gpus):
    fake, tick = two_gpus
    await tick.run(1)  # limits and fans of both GPUs taken
    journal = tick.applier.journal
    assert {"gpu0/power_limit", "gpu1/power_limit", "gpu1/fan0"} <= set(journal.entries())
    fake.remove_gpu(1)
    world, events = await rediscover(tick.world, {"nvml"}, applier=tick.applier, t_wall=1.0)
    assert [d.id for d in world.devices] == ["gpu0"]
    assert {(e.subject, e.data["action"]) for e in events} == {
        ("gpu1", "removed"), ("gpu1/power_limit", "forgotten"), ("gpu1/fan0", "forgotten")}
    assert "gpu1/power_limit" in journal and "gpu0/power_limit" in journal  # put back if it returns


async def test_a_removed_first_gpu_leaves_the_other_its_id(two_gpus):
    fake, tick = two_gpus
    await tick.run(1)
    fake.remove_gpu(0)  # NVML now enumerates the second GPU at index 0: it keeps its id by UUID
    world, events = await rediscover(tick.world, {"nvml"}, applier=tick.applier, t_wall=1.0)
    assert [d.id for d in world.devices] == ["gpu1"]
    assert {(e.subject, e.data["action"]) for e in events} == {
        ("gpu0", "removed"), ("gpu0/power_limit", "forgotten"), ("gpu0/fan0", "forgotten")}
    assert "gpu1/power_limit" in tick.applier.journal
    tick.world = world
    snap = await tick.run(2)
    assert snap.readings["gpu1/temperature"].value is not None and "gpu1" not in snap.degraded
    fake.revive_gpu(0)  # back on the bus: adopted under its old id, the other GPU's id unchanged
    world, events = await rediscover(world, {"nvml"}, applier=tick.applier, t_wall=2.0)
    assert [d.id for d in world.devices] == ["gpu0", "gpu1"]
    assert [(e.subject, e.data["action"]) for e in events] == [("gpu0", "added")]


async def test_a_lost_gpu_is_reported_once_and_skipped_while_the_other_keeps_working(tmp_path, root,
                                                                                       policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    settings = settings_for(tmp_path, root, policy_dir)
    d = Daemon(settings, clock=clock, backends=[backend], sleep=clock.sleep,
               watchers=WatcherOptions(hotplug=True, udev=False))
    events = []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))

    def step():
        seq = d.hub.latest.seq
        if seq == 2:
            fake.lose_gpu(1)  # GPU_IS_LOST on every call; still enumerated
        if seq == 4:
            fake.gpus[0].limit_mw = 123_000  # someone changes gpu0's limit: the loop puts it back
        return seq >= 7

    # the lost GPU's originals cannot be restored: they stay journaled for 'aithermd restore' (exit 1)
    assert await d.run(until=step) == 1
    assert set(d.tick.applier.journal.entries()) == {"gpu1/power_limit", "gpu1/fan0"}
    lost = [e for e in events if e.kind == "fault" and e.subject == "gpu1"]
    assert [e.message for e in lost] == ["gpu1 lost: skipped until it comes back"]
    assert not [e for e in events if e.kind in ("actuation", "drift") and e.subject.startswith("gpu1/")
                and e.t_wall > lost[0].t_wall]  # nothing written to it after
    assert [e.subject for e in events if e.kind == "drift"] == ["gpu0/power_limit"]
    assert [e.message for e in events if e.kind == "actuation" and e.t_wall > lost[0].t_wall] == [
        "gpu0/power_limit: 123 → 280 W (follow/limit)"]
    assert d.hub.latest.readings["gpu0/temperature"].status == "ok" and "gpu1" in d.hub.latest.degraded
    assert fake.power_limit_w(0) == 350.0  # gpu0 restored at the stop


async def test_the_daemon_applies_device_events_between_ticks(tmp_path, root, policy_dir, clock):
    saved = tmp_path / "amdgpu"
    shutil.copytree(root / AMDGPU, saved, symlinks=True)
    d = Daemon(settings_for(tmp_path, root, policy_dir), clock=clock, backends=[HwmonBackend(str(root))],
               sleep=clock.sleep, watchers=WatcherOptions(hotplug=True, udev=False, settle_s=0.5))
    seen = []
    d.hub.add_listener(lambda snap, evs: seen.append((snap.seq, [x.id for x in snap.devices],
                                                      [(e.subject, e.message) for e in evs
                                                       if e.kind == "hotplug"])))
    path = str(root / AMDGPU)

    def step():
        seq = d.hub.latest.seq
        if seq == 2:
            remove_amdgpu(root)
            d.hotplug.submit(DeviceEvent("remove", "hwmon", path))
        if seq == 5:
            shutil.copytree(saved, root / AMDGPU, symlinks=True)
            (root / "class" / "hwmon" / "hwmon0").symlink_to(f"../../{AMDGPU}")
            d.hotplug.submit(DeviceEvent("add", "hwmon", path))
        return seq >= 7

    assert await d.run(until=step) == 0
    with_amd = ["hwmon:k10temp-pci-00c3", AMD, "hwmon:nct6798-isa-0290"]
    without = [i for i in with_amd if i != AMD]
    assert [s[1] for s in seen] == [with_amd, with_amd, without, without, without, with_amd, with_amd]
    assert [s[2] for s in seen if s[2]] == [[(AMD, f"{AMD} removed")],
                                            [(AMD, f"{AMD} added (4 channels, 1 knobs)")]]
