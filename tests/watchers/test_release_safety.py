"""ReleaseGpu while a critical-temperature cut holds the GPU's limit (attack6 G4): the release handed the
original limit back at once (184 → 450 W) and the GPU ran over its trip point unwatched. It is refused
with Busy, naming the cut; the cut stays; the GPU stays watched; once the cut has ended it may go."""

from __future__ import annotations

import asyncio

import pytest

from aithermd.backends.nvml import NvmlBackend
from aithermd.errors import Busy
from aithermd.runtime.daemon import Daemon
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.watchers.options import WatcherOptions

from .conftest import GPU_DUMPS, NO_HANG_S, settings_for

HOT = """\
description: a GPU temperature limit every GPU of the fake is over
safety: {gpu_temp_limit_c: %s}
rules:
  - name: limit
    kind: gpu_power_limit
    limit: 100%%
"""


async def test_a_release_during_a_critical_cut_is_refused_and_the_cut_stays(tmp_path, root, policy_dir,
                                                                           clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    temp = min(g.temp_c for g in fake.gpus)
    (policy_dir / "hot.yaml").write_text(HOT % int(temp - 5))
    original = fake.power_limit_w(1)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir, policy="hot"), clock=clock, backends=[backend],
               sleep=clock.sleep, watchers=WatcherOptions())
    seen: dict = {}

    async def release():
        try:
            seen["message"] = await d.control.release_gpu("gpu1")
        except Exception as exc:  # noqa: BLE001 - what the D-Bus caller gets
            seen["error"] = exc
        seen["limit"] = fake.power_limit_w(1)

    def step():
        seq = d.hub.latest.seq
        if seq == 4:
            seen["cut"] = fake.power_limit_w(1)
            seen["task"] = asyncio.get_running_loop().create_task(release())
        if seq == 10:
            seen["devices"] = [x.id for x in d.hub.latest.devices]
            seen["after"] = fake.power_limit_w(1)
        return seq >= 10

    assert await d.run(until=step) == 0
    await seen["task"]
    assert seen["cut"] < original, "the critical cut is in force before the release"
    assert isinstance(seen.get("error"), Busy), seen
    assert "gpu1/power_limit" in str(seen["error"]) and "safety/" in str(seen["error"])
    assert seen["limit"] == seen["cut"] and seen["after"] == seen["cut"], "the cut stayed"
    assert "gpu1" in seen["devices"], "still watched"


async def test_a_release_once_no_safety_decision_holds_it_goes_ahead(tmp_path, root, policy_dir, clock):
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    (policy_dir / "hot.yaml").write_text(HOT % 110)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir, policy="hot"), clock=clock, backends=[backend],
               sleep=clock.sleep, watchers=WatcherOptions())
    seen: dict = {}

    async def release():
        seen["message"] = await d.control.release_gpu("gpu1")

    def step():
        if d.hub.latest.seq == 3:
            seen["task"] = asyncio.get_running_loop().create_task(release())
        return d.hub.latest.seq >= 6

    assert await d.run(until=step) == 0
    await seen["task"]
    assert "released" in seen["message"]
    assert [x.id for x in d.hub.latest.devices] == ["gpu0"]


@pytest.mark.parametrize("name", ["io.github.aithermd.Error.Busy"])
def test_busy_is_its_own_dbus_error(name):
    from aithermd.publish.dbus_control import dbus_error

    assert dbus_error(Busy("gpu1 not released")).type == name


async def test_a_released_gpu_never_unbound_is_adopted_again_and_its_cut_returns(tmp_path, root, policy_dir,
                                                                                 clock, monkeypatch):
    """attack6 G4: released, no unbind followed (a process held the device, the admin gave up): gpu1 ran
    over its trip point unwatched for the daemon's life. After READOPT_S it is adopted again and cut."""
    from aithermd.runtime import release as release_module

    monkeypatch.setattr(release_module, "READOPT_S", 30.0, raising=False)
    fake = FakeNvml.from_dumps(GPU_DUMPS)
    temp = min(g.temp_c for g in fake.gpus)
    (policy_dir / "hot.yaml").write_text(HOT % 110)
    original = fake.power_limit_w(1)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir, policy="hot"), clock=clock, backends=[backend],
               sleep=clock.sleep, watchers=WatcherOptions())
    seen: dict = {}
    start = clock.monotonic()

    async def release():
        seen["message"] = await d.control.release_gpu("gpu1")
        seen["released_at"] = clock.monotonic()
        # the GPU's job goes on and it heats up past the trip point of the policy
        (policy_dir / "hot.yaml").write_text(HOT % int(temp - 5))
        d.reload_now()

    def step():
        devices = [x.id for x in d.hub.latest.devices]
        if d.hub.latest.seq == 3:
            seen["task"] = asyncio.get_running_loop().create_task(release())
        if "released_at" in seen and "gone" not in seen and "gpu1" not in devices:
            seen["gone"] = True
        if seen.get("gone") and "gpu1" in devices and "back_at" not in seen:
            seen["back_at"] = clock.monotonic()
        if "back_at" in seen and fake.power_limit_w(1) < original:
            seen["cut"] = fake.power_limit_w(1)
        return "cut" in seen or clock.monotonic() - start > 600

    assert await d.run(until=step) == 0
    await seen["task"]
    assert "released" in seen["message"] and seen.get("gone")
    assert "back_at" in seen, "adopted again"
    assert 30.0 <= seen["back_at"] - seen["released_at"] <= 60.0
    assert seen.get("cut", original) < original, "its critical cut is back"


async def test_a_released_gpu_is_on_the_metrics_page_as_released_and_unwatched(tmp_path, root, policy_dir,
                                                                              clock):
    """attack6 G4: every gpu1 series left /metrics at the release and nothing said it was released."""
    from prometheus_client.parser import text_string_to_metric_families

    from aithermd.publish import metrics

    fake = FakeNvml.from_dumps(GPU_DUMPS)
    (policy_dir / "hot.yaml").write_text(HOT % 110)
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock, read_deadline_s=NO_HANG_S)
    d = Daemon(settings_for(tmp_path, root, policy_dir, policy="hot"), clock=clock, backends=[backend],
               sleep=clock.sleep, watchers=WatcherOptions())
    handle = metrics.start("none", d.hub)
    scrapes: list[dict] = []
    seen: dict = {}

    def scrape() -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(metrics.render(handle).decode())
                for s in family.samples}

    async def release():
        seen["message"] = await d.control.release_gpu("gpu1")

    def step():
        seq = d.hub.latest.seq
        if seq in (1, 8):
            scrapes.append(scrape())
        if seq == 3:
            seen["task"] = asyncio.get_running_loop().create_task(release())
        return seq >= 8

    try:
        assert await d.run(until=step) == 0
    finally:
        handle.stop()
    await seen["task"]
    first, later = scrapes
    assert first[("aithermd_gpus_released", ())] == 0.0, "there at 0 before any release"
    assert not [k for k in first if k[0] == "aithermd_gpu_released"]
    assert later[("aithermd_gpus_released", ())] == 1.0
    gpu1 = (("pci_bus_id", fake.gpus[1].bus_id), ("uuid", fake.gpus[1].uuid))
    assert later[("aithermd_gpu_released", gpu1)] == 1.0
