"""Fixtures for the watchers (fast lane, hotplug, logind, suspend): a copy of a recorded board
(:mod:`tests.support.machines`), small policies, a tick built the way the daemon builds it, fake NVML GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal
from aithermd.actuate.worker import Worker
from aithermd.publish.hub import StateHub
from aithermd.runtime.control import Control
from aithermd.runtime.tick import Tick
from aithermd.runtime.world import Engine, build_world
from aithermd.settings import DaemonSettings
from tests.support.machines import NVIDIA_SMI, copy_machine

# NVML calls run on a real thread under a real-time read deadline (0.5 s by default). These tests are not
# about hung GPUs, and on a loaded machine a thread can wait longer than that to be scheduled: the GPU would
# then be marked hung, which is not what they test.
NO_HANG_S = 30.0

GPU_DUMPS = [NVIDIA_SMI / "rtx3090-nvidia-smi-q-x-driver-v13.xml",
             NVIDIA_SMI / "rtx-a6000-nvidia-smi-q-windows-idle.txt"]
AMDGPU = "devices/pci0000:00/0000:07:00.0/hwmon/hwmon0"
NCT = "devices/platform/nct6775.656/hwmon/hwmon1"

POLICIES = {
    # board fans follow the GPU's edge temperature; GPU limits at 80 %, GPU fans at 40 %
    "follow": """\
description: watchers - board fans follow the amdgpu edge temperature
curves:
  edge:
    kind: points
    source: edge
    points: [[30, 30], [80, 60]]
rules:
  - name: board-fans
    kind: fan
    fans: {chip: ["nct*"]}
    curve: edge
  - name: limit
    kind: gpu_power_limit
    limit: 80%
  - name: gpu-fans
    kind: fan
    fans: {id: ["gpu*/fan*"]}
    duty_pct: 40
""",
    "steady": """\
description: watchers - board fans (and those of a hot-plugged it87 chip) at a fixed 60 %
rules:
  - name: board-fans
    kind: fan
    fans: {chip: ["nct*", "it87*"]}
    duty_pct: 60
""",
}


@pytest.fixture
def root(tmp_path) -> Path:
    return copy_machine(tmp_path)


@pytest.fixture
def policy_dir(tmp_path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    for name, text in POLICIES.items():
        (d / f"{name}.yaml").write_text(text)
    return d


def settings_for(tmp_path: Path, root: Path, policy_dir: Path, policy: str = "follow",
                 **kw) -> DaemonSettings:
    return DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", policy_dirs=[policy_dir],
                          policy=policy, policy_pinned=True, bus="none", metrics_listen="none", nvml=False,
                          **kw)


def make_tick(settings: DaemonSettings, backends, clock, hub: StateHub | None = None) -> Tick:
    """A tick as :class:`~aithermd.runtime.daemon.Daemon` builds it (engine, journal, applier, worker)."""
    engine = Engine.default()
    world = build_world(settings, backends, engine)
    hub = hub or StateHub()
    control = Control(settings.state_dir, clock=clock, hub=hub, policies=lambda: world.policies,
                        knobs=lambda: world.knobs, reload=lambda: None, default_policy=settings.policy,
                        pinned=True)
    executor = Executor(Applier(Journal(settings.state_dir)), Worker(max(settings.tick_s, 0.5)))
    return Tick(world, executor=executor, control=control, hub=hub, engine=engine, clock=clock,
                tick_s=settings.tick_s, dry_run=False)


def write(root: Path, rel: str, value: int) -> None:
    (root / rel).write_text(f"{value}\n")


def read(root: Path, rel: str) -> int:
    return int((root / rel).read_text())
