"""The daemon with GPUs that misbehave over months, through the real NVML backend over the fake NVML: a GPU
not ready at start adopted and controlled (its originals journaled first), a GPU lost and back, a knob
NVML refuses as root made read-only once, a limit enforced below the requested one named, a draw above
the enforced limit alerted and the limit written again once, a GPU released."""

from __future__ import annotations

import asyncio
import dataclasses

import pynvml as E

from aithermd.backends.nvml import NvmlBackend
from aithermd.runtime.daemon import Daemon
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.watchers.options import WatcherOptions

from .conftest import GPU_DUMPS, NO_HANG_S, settings_for


def daemon(tmp_path, root, policy_dir, clock, fake, **kw):
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, **{"read_deadline_s": NO_HANG_S, **kw})
    d = Daemon(settings_for(tmp_path, root, policy_dir), clock=clock, backends=[backend], sleep=clock.sleep,
               watchers=WatcherOptions())
    events: list = []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))
    return d, backend, events


async def test_a_gpu_not_ready_at_start_is_adopted_and_controlled_originals_first(tmp_path, root, policy_dir,
                                                                                   clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    fake.inject("nvmlDeviceGetHandleByIndex_v2", 1, E.NVML_ERROR_NOT_READY)  # e.g. still in its reset
    original = fake.power_limit_w(1)
    d, backend, events = daemon(tmp_path, root, policy_dir, clock, fake)
    seen = []

    def step():
        snap = d.hub.latest
        seen.append(sorted(dev.id for dev in snap.devices))
        if snap.seq == 3:
            fake.clear_injections()
        if snap.seq == 12:
            entry = d.tick.applier.journal.entries().get("gpu1/power_limit")
            seen.append(entry.saved["limit_mw"] if entry else None)
        return snap.seq >= 12

    assert await d.run(until=step) == 0
    assert seen[0] == ["gpu0"] and seen[-2] == ["gpu0", "gpu1"]
    assert seen[-1] == original * 1000, "the original was journaled before the first write"
    assert [e.subject for e in events if e.kind == "hotplug"] == ["gpu1"]
    assert any(e.kind == "actuation" and e.subject == "gpu1/power_limit" for e in events), "controlled"
    assert fake.power_limit_w(1) == original, "restored at the stop"


async def test_a_knob_nvml_refuses_to_root_is_read_only_once_with_no_journal_entry(tmp_path, root, policy_dir,
                                                                                    clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    fake.privileged = False  # a container without CAP_SYS_ADMIN: NO_PERMISSION even though we are root
    d, backend, events = daemon(tmp_path, root, policy_dir, clock, fake, probe_writes=False)
    calls = []

    def step():
        calls.append(fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0))
        return d.hub.latest.seq >= 8

    assert await d.run(until=step) == 0  # nothing was changed, so nothing needs restoring
    # The two writes run on worker threads, so the tick they land in is not fixed; the count over eight ticks is.
    assert calls[-1] == 2, "each GPU's limit tried once, never again"
    knob = d.world.knobs["gpu0/power_limit"]
    assert not knob.writable and "CAP_SYS_ADMIN" in knob.why_not
    faults = [e for e in events if e.kind == "fault" and e.subject == "gpu0/power_limit"]
    assert len(faults) == 1 and "NoPermission" in faults[0].message
    assert "gpu0/power_limit" not in d.tick.applier.journal.entries()
    try:
        d.control.set_override("gpu0/power_limit", 300.0, 0.0)
    except Exception as exc:  # noqa: BLE001 - the reason travels to D-Bus callers
        refused = str(exc)
    assert "read-only" in refused and "NO_PERMISSION" in refused


async def test_a_cap_below_the_request_is_named_and_a_draw_above_it_rewrites_the_limit_once(
        tmp_path, root, policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    d, backend, events = daemon(tmp_path, root, policy_dir, clock, fake)
    writes = []

    def step():
        seq = d.hub.latest.seq
        if seq == 3:
            fake.cap_power(0, 200.0)  # the BMC caps the board below the policy's 280 W
        if seq >= 5:
            fake.set_dynamic(0, power_draw_w=260.0)  # yet it draws well above 200 W
        writes.append(fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0))
        return seq >= 60

    assert await d.run(until=step) == 0
    capped = [e for e in events if e.data.get("why") == "enforced_below_requested"]
    assert len(capped) == 1 and capped[0].subject == "gpu0/power_limit"
    assert "out-of-band" in capped[0].data["capped_by"] and "enforced limit 200 W" in capped[0].message
    above = [e for e in events if e.kind == "power"]
    assert len(above) == 1 and above[0].data["reapplied"] and "260 W" in above[0].message
    assert writes[-1] - writes[10] == 1, "the requested limit written again once, not every tick"
    limits = d.hub.latest.health["power_limits"]["gpu0/power_limit"]
    assert (limits["requested_w"], limits["enforced_w"]) == (280.0, 200.0)


async def test_a_gpu_lost_then_reset_is_controlled_again(tmp_path, root, policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    d, backend, events = daemon(tmp_path, root, policy_dir, clock, fake)

    def step():
        seq = d.hub.latest.seq
        if seq == 3:
            fake.lose_gpu(1)
        if seq == 10:
            fake.gpus[1].limit_mw = fake.gpus[1].default_mw  # a reset puts the default limit back
            fake.revive_gpu(1)
        return seq >= 400

    assert await d.run(until=step) == 0
    snap = d.hub.latest
    assert "gpu1" not in snap.degraded and snap.health["nvml"]["gpus"]["gpu1"]["state"] == "ok"
    assert snap.knobs["gpu1/power_limit"].value == 240.0, "the policy's limit is back in force"
    assert fake.power_limit_w(1) == 300.0, "and the original restored at the stop"


async def test_gpu_health_is_exported_for_alerts(tmp_path, root, policy_dir, clock):
    from prometheus_client.parser import text_string_to_metric_families

    from aithermd.publish import metrics

    fake = FakeNvml.from_dumps(GPU_DUMPS)
    d, backend, events = daemon(tmp_path, root, policy_dir, clock, fake)
    handle = metrics.start("none", d.hub)
    scrapes = []

    def scrape() -> dict:
        out = {}
        for family in text_string_to_metric_families(metrics.render(handle).decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def step():
        seq = d.hub.latest.seq
        if seq in (1, 6):
            scrapes.append(scrape())
        if seq == 3:
            fake.lose_gpu(1)
        return seq >= 6

    try:
        assert await d.run(until=step) in (0, 1)
    finally:
        handle.stop()
    first, later = scrapes
    bus1 = fake.gpus[1].bus_id
    up1 = ("aithermd_gpu_up", (("gpu", "1"), ("pci_bus_id", bus1), ("uuid", fake.gpus[1].uuid)))
    assert first[up1] == 1.0 and later[up1] == 0.0
    assert (first[("aithermd_gpus_expected", ())], first[("aithermd_gpus_present", ())]) == (2.0, 2.0)
    assert (later[("aithermd_gpus_expected", ())], later[("aithermd_gpus_present", ())]) == (2.0, 1.0)
    assert first[("aithermd_nvml_up", ())] == 1.0 and first[("aithermd_nvml_reinits_total", ())] == 0.0
    above = ("aithermd_gpu_power_above_limit_total", (("knob", "gpu0/power_limit"),))
    assert first[above] == 0.0, "the counter is there at 0 before any event"


async def test_a_released_gpu_gets_its_originals_back_and_is_left_alone_until_udev_brings_it_back(
        tmp_path, root, policy_dir, clock):
    from aithermd.watchers.hotplug import DeviceEvent

    fake = FakeNvml.from_dumps(GPU_DUMPS)
    original = fake.power_limit_w(1)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir), clock=clock, backends=[backend], sleep=clock.sleep,
               watchers=WatcherOptions(hotplug=True, udev=False, settle_s=0.0))
    seen = {}
    sys_path = "/sys/devices/pci0000:00/" + fake.gpus[1].bus_id[4:].lower()

    async def release():
        seen["message"] = await d.control.release_gpu("gpu1")
        seen["limit"] = fake.power_limit_w(1)

    def step():
        seq = d.hub.latest.seq
        if seq == 3:
            seen["task"] = asyncio.get_running_loop().create_task(release())
        if seq == 8:
            seen["devices"] = [x.id for x in d.hub.latest.devices]
            seen["calls"] = fake.calls.get("nvmlDeviceGetFieldValues", 0)
        if seq == 12:
            seen["calls"] = fake.calls["nvmlDeviceGetFieldValues"] - seen["calls"]
            d.hotplug.submit(DeviceEvent("add", "pci", sys_path, "10de"))  # it is back
        return seq >= 16

    assert await d.run(until=step) == 0
    await seen["task"]
    assert "gpu1" in seen["message"] and "originals restored" in seen["message"]
    assert seen["limit"] == original, "its original limit was put back before it was let go"
    assert seen["devices"] == ["gpu0"] and seen["calls"] == 4, "only gpu0 was read meanwhile"
    assert [x.id for x in d.hub.latest.devices] == ["gpu0", "gpu1"], "adopted again after the udev add"
    assert fake.power_limit_w(1) == original


async def test_a_udev_remove_of_a_gpu_releases_it_first(tmp_path, root, policy_dir, clock):
    from aithermd.watchers.hotplug import DeviceEvent

    fake = FakeNvml.from_dumps(GPU_DUMPS)
    original = fake.power_limit_w(0)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir), clock=clock, backends=[backend], sleep=clock.sleep,
               watchers=WatcherOptions(hotplug=True, udev=False, settle_s=0.0))
    events = []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))
    sys_path = "/sys/devices/pci0000:00/" + fake.gpus[0].bus_id[4:].lower()

    def step():
        seq = d.hub.latest.seq
        if seq == 3:
            assert fake.power_limit_w(0) != original  # the policy's limit is in force
            d.hotplug.submit(DeviceEvent("unbind", "pci", sys_path, "10de"))  # the driver lets go
        return seq >= 6

    assert await d.run(until=step) == 0
    released = [e for e in events if e.data.get("action") == "released"]
    assert [e.subject for e in released] == ["gpu0"] and fake.power_limit_w(0) == original
    assert [x.id for x in d.hub.latest.devices] == ["gpu1"]


MAX_LIMIT = """\
description: watchers - every GPU's power limit at its maximum
rules:
  - {name: limit, kind: gpu_power_limit, limit: max}
"""


async def test_constraints_changed_under_the_daemon_are_read_again_clamped_to_and_restored_within(
        tmp_path, root, policy_dir, clock):
    """attack4 B2: a driver reload with another VBIOS lowers gpu0's maximum (and default) under the limit the
    daemon found; the stale maximum was written and refused every tick, and the stop's restore failed."""
    (policy_dir / "max.yaml").write_text(MAX_LIMIT)
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    original, top = fake.power_limit_w(0), fake.gpus[0].max_mw / 1000
    lower = original - 50.0
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir, "max"), clock=clock, backends=[backend],
               sleep=clock.sleep, watchers=WatcherOptions())
    events: list = []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))
    sets: dict[int, int] = {}

    def step():
        seq = d.hub.latest.seq
        if seq == 3:
            g = fake.gpus[0]
            g.profile = dataclasses.replace(g.profile, max_power_limit_w=lower, default_power_limit_w=lower)
            g.limit_mw = int(lower * 1000)
        sets[seq] = fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)
        return seq >= 15

    assert await d.run(until=step) == 0, "the stop's restore succeeded"
    assert top > original and d.tick is not None
    assert sets[15] - sets[4] <= 2, "the refused maximum once, then the new one: no write storm"
    changed = [e for e in events if e.kind == "hotplug" and e.subject == "gpu0/power_limit"]
    assert len(changed) == 1 and f"{top:g} W" in changed[0].message, changed
    assert f"→ {fake.gpus[0].min_mw / 1000:g}–{lower:g} W (default {lower:g} W)" in changed[0].message, changed
    assert d.world.knobs["gpu0/power_limit"].max == lower
    assert fake.power_limit_w(0) == lower, "the original clamped into the constraints now"
    assert not d.not_restored and "gpu0/power_limit" not in d.tick.applier.journal.entries()
