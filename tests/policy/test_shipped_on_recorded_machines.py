"""The shipped policies on every recorded machine (../shared/fixtures and ../shared/realdata, copied into
tests/fixtures): each fan a policy drives follows its curve from a source found on that machine, never the
safety layer's failed-source 100 %, including on older kernels whose k10temp or coretemp show no labels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aithermd.backends.registry import discover, open_backends
from aithermd.backends.trust import SensorTrust
from aithermd.model import KnobKind, Layer
from aithermd.policy.engine import EngineInput, evaluate, initial_state
from aithermd.policy.loader import load_policy_file, shipped_policy_dir
from aithermd.sim import ttar
from tests.backends.helpers import MACHINES, TTAR
from tests.backends.test_ttar_trees import amdgpu_tree
from tests.support.machines import copy_machine

POLICIES = ("balanced", "ai-training", "quiet")
TREES = sorted(p.name for p in TTAR.glob("*.ttar") if "rapl" not in p.name and "cpufreq" not in p.name)  # no sensors
X570 = "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp"
Z690 = "asus-rog-strix-z690-e-alderlake-coretemp-nvme"


AMDGPU_BDF = {"rx6900xt": "0000:0b:00.0", "rx7900xtx": "0000:03:00.0", "rx9070xt": "0000:03:00.0"}


def build_tree(base: Path, archive: str) -> Path:
    """The recorded tree as a sysfs root: amdgpu card captures and the applesmc directory placed where the
    kernel keeps them (as tests/backends/test_ttar_trees.py does), the others extracted as they are."""
    if archive.startswith("amdgpu-"):
        model = archive.split("-")[1]
        return amdgpu_tree(base, archive, AMDGPU_BDF[model], add_name=True)
    ttar.extract(TTAR / archive, base)
    if archive.startswith("imac"):
        root = base / "sys"
        smc = root / "devices" / "platform" / "applesmc.768"
        (smc / "hwmon" / "hwmon0").mkdir(parents=True)
        os.symlink("../..", smc / "hwmon" / "hwmon0" / "device")
        (root / "class" / "hwmon").mkdir(parents=True)
        os.symlink("../../devices/platform/applesmc.768/hwmon/hwmon0", root / "class" / "hwmon" / "hwmon0")
        return root
    return min((p.parent for p in base.rglob("class") if p.is_dir()), key=lambda p: len(p.parts))


def run_policy(root: Path, policy_name: str, ticks: int = 4):
    """Discover ``root`` with the daemon's backends, run the shipped policy ``ticks`` seconds through the
    sensor trust and the engine; the last result and the devices."""
    backends = open_backends(str(root), cpu=False)
    devices = tuple(discover(backends).devices)
    policy = load_policy_file(shipped_policy_dir() / f"{policy_name}.yaml")
    trust = SensorTrust()
    trust.configure(devices)
    state, result = initial_state(), None
    try:
        for t in range(ticks):
            readings, knobs = {}, {}
            for b in backends:
                s = b.sample()
                readings.update(s.readings)
                knobs.update(s.knobs)
            readings = trust.filter(float(t), readings)
            inp = EngineInput(t_mono=float(t), t_wall=1_760_000_000.0 + t, devices=devices, readings=readings,
                              knobs=knobs)
            result = evaluate(policy, (), inp, state)
            state = result.state
    finally:
        for b in backends:
            b.close()
    return result, devices


def fan_decisions(result, devices):
    fans = {k.id for d in devices for k in d.knobs if k.kind in (KnobKind.PWM, KnobKind.FAN)}
    return {k: d for k, d in result.decisions.items() if k in fans}


def assert_no_fan_pinned(result, devices):
    for knob, d in fan_decisions(result, devices).items():
        assert d.rule != "safety/failed-source", f"{knob}: {d.reason}"
        if d.layer is Layer.POLICY and "curve_pct" in d.inputs:
            assert any(k.startswith("used:") for k in d.inputs), d.inputs


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("machine", MACHINES)
def test_shipped_policy_on_recorded_machine(machine, policy, tmp_path):
    root = copy_machine(tmp_path, machine)
    result, devices = run_policy(root, policy)
    assert_no_fan_pinned(result, devices)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("tree", TREES)
def test_shipped_policy_on_recorded_ttar_tree(tree, policy, tmp_path):
    result, devices = run_policy(build_tree(tmp_path, tree), policy)
    assert_no_fan_pinned(result, devices)


@pytest.mark.parametrize("policy", POLICIES)
def test_board_fans_follow_an_unlabelled_k10temp(policy, tmp_path):
    """A kernel before 5.6 shows k10temp's Tctl as plain temp1: the board fans still follow it."""
    root = copy_machine(tmp_path, X570)
    for label in (root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2").glob("temp*_label"):
        label.unlink()
    result, devices = run_policy(root, policy)
    fans = {k: d for k, d in fan_decisions(result, devices).items() if not k.startswith("gpu")}
    gpu_fans = {k: d for k, d in fan_decisions(result, devices).items() if k.startswith("gpu")}
    assert {d.rule for d in gpu_fans.values()} <= {f"{policy}/gpu-fans"}  # the amdgpu's own, by its own curve
    assert len(fans) == 6
    for d in fans.values():
        assert d.layer is Layer.POLICY and d.rule == f"{policy}/board-fans"
        # and the board's amdgpu, gpu0 since GPUs are read through their hwmon chips: every GPU counts
        assert d.inputs["used:board"] == "hwmon:k10temp-pci-00c3/temp1,hwmon:k10temp-pci-00c3/temp2,gpu0/temperature"
        assert d.value < 100.0


def test_board_fans_fall_back_when_the_cpu_temperature_fails(tmp_path):
    """Tctl and Tdie fail for good (their files gone: ENOENT, persistent): the board fans follow the next
    alternative that reads — any other CPU temperature, here the CCD's Tccd1 — and explain says which."""
    root = copy_machine(tmp_path, X570)
    k10 = root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2"
    for f in ("temp1_input", "temp2_input"):
        (k10 / f).unlink()  # reads fail with ENOENT: persistent
    result, devices = run_policy(root, "balanced")
    d = result.decisions["hwmon:nct6798-isa-0290/pwm1"]
    assert d.layer is Layer.POLICY
    assert d.inputs["used:board"] == "hwmon:k10temp-pci-00c3/temp3,gpu0/temperature"
    (root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2/temp3_input").unlink()
    result, devices = run_policy(root, "balanced")
    d = result.decisions["hwmon:nct6798-isa-0290/pwm1"]
    assert d.inputs["used:board"] == "hwmon:nct6798-isa-0290/temp1,hwmon:nct6798-isa-0290/temp2,gpu0/temperature"
