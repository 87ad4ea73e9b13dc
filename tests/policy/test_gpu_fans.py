"""The shipped GPU fan curve: each GPU's fans follow that GPU's own temperature by one rule for all GPUs,
through the real NVML bindings over the fake NVML, and go back to the driver's automatic curve on exit."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.nvml import NvmlBackend
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.machine import default_profiles
from tests.support.machines import copy_machine


@pytest.mark.parametrize("policy", ["balanced", "ai-training", "quiet"])
async def test_each_gpus_fans_follow_its_own_temperature_and_return_to_auto(tmp_path, clock, policy):
    root = copy_machine(tmp_path)
    nvml = FakeNvml(default_profiles(), state_path=tmp_path / "nvml.json")
    nvml.set_dynamic(0, temp_c=78.0)  # a hot RTX 4090 beside a cool RTX 6000 Ada
    nvml.set_dynamic(1, temp_c=45.0)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False, policy=policy, policy_pinned=True)
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root)), NvmlBackend(nvml=nvml.bindings())],
               sleep=clock.sleep)
    during: list[tuple[bool, bool, int, int]] = []

    def look() -> bool:
        during.append((nvml.fan_auto(0, 0), nvml.fan_auto(1, 0), nvml.fan_target_pct(0, 0),
                       nvml.fan_target_pct(1, 0)))
        return False

    await d.run(max_ticks=40, until=look)
    snap = d.hub.latest
    hot, cool = snap.decisions["gpu0/fan0"], snap.decisions["gpu1/fan0"]
    assert hot.rule == cool.rule == f"{policy}/gpu-fans"
    assert hot.inputs["used:gpu"] == "gpu0/temperature" and cool.inputs["used:gpu"] == "gpu1/temperature"
    assert hot.value > cool.value + 20  # each follows its own card
    assert during[-1][:2] == (False, False) and during[-1][2] > during[-1][3]  # manual, written
    assert (nvml.fan_auto(0, 0), nvml.fan_auto(1, 0)) == (True, True)  # the driver's own curve again
