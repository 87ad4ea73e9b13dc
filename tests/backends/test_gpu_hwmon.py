"""AMD GPUs from the recorded amdgpu trees (RX 6900 XT, 7900 XTX, 9070 XT) and an Intel xe card, as gpuN
devices in NVML's vocabulary: what discovery finds, what a sample reads, what the knobs write and restore,
and that the same policies raise, relax, budget and keep them safe."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from aithermd.backends.gpu_hwmon import GPU_DRIVERS, HwmonGpuBackend
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.registry import discover, open_backends
from aithermd.errors import DeviceLost, OutOfRange
from aithermd.model import Device, DeviceKind, Layer, Status
from aithermd.policy.engine import EngineInput, evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from tests.backends.faults import FaultIO
from tests.backends.test_ttar_trees import amdgpu_tree

TREES = {
    "rx6900xt": ("amdgpu-rx6900xt-drm-card-hwmon-sysfs.ttar", "0000:0b:00.0"),
    "rx7900xtx": ("amdgpu-rx7900xtx-drm-card-hwmon-sysfs.ttar", "0000:03:00.0"),
    "rx9070xt": ("amdgpu-rx9070xt-drm-card-hwmon-sysfs.ttar", "0000:0c:00.0"),
}


def tree(tmp_path: Path, card: str) -> Path:
    archive, bdf = TREES[card]
    return amdgpu_tree(tmp_path / card, archive, bdf, add_name=True)  # the 7900 XTX capture lacks `name`


def read(root: Path, index_base: int = 0) -> tuple[HwmonGpuBackend, Device, object]:
    backend = HwmonGpuBackend(str(root), index_base=index_base)
    (device,) = backend.discover()
    return backend, device, backend.sample()


def values(device: Device, sample) -> dict[str, float | None]:
    return {c.attribute: sample.readings[c.id].value for c in device.channels}


def test_rx6900xt_reads_as_a_gpu(tmp_path):
    backend, dev, sample = read(tree(tmp_path, "rx6900xt"))
    assert (dev.id, dev.kind, dev.name) == ("gpu0", DeviceKind.GPU, "AMD GPU 1002:73bf")
    assert dev.info["pci_bus_id"] == "0000:0b:00.0" and dev.info["driver"] == "amdgpu"
    assert values(dev, sample) == {"temperature": 56.0, "junction_temperature": 59.0, "memory_temperature": 54.0,
                                   "power": 36.0, "utilization": 3.0, "sm_clock": 500.0, "memory_clock": 1000.0,
                                   "voltage": 0.775, "fan0_rpm": 0.0, "fan0": 0.0}
    temp = next(c for c in dev.channels if c.attribute == "temperature")
    assert (temp.label, dict(temp.thresholds)) == ("edge", {"slowdown": 100.0, "shutdown": 105.0})
    limit, fan = dev.knobs
    # power1_cap_min reads 0 on this card: not a minimum the driver stands behind
    assert (limit.id, limit.min, limit.max, limit.default) == ("gpu0/power_limit", None, 332.0, 289.0)
    assert sample.knobs[limit.id].value == 289.0
    assert (fan.id, fan.fan_channel, fan.writable) == ("gpu0/fan0", "gpu0/fan0_rpm", True)
    assert sample.knobs[fan.id].mode == "auto"
    backend.close()


def test_the_fast_lanes_reader_of_a_gpu_temperature_reads_what_the_sample_reads(tmp_path):
    """The fast lane reads a GPU's temperatures near a trip point through reader(): it was built with five
    arguments for HwmonReader's four, so every re-arm near a line raised TypeError (hang8, seen at 90 °C)."""
    root = tree(tmp_path, "rx6900xt")
    backend, dev, sample = read(root)
    temps = [c.id for c in dev.channels if c.quantity.name == "TEMPERATURE"]
    readers = {cid: backend.reader(cid) for cid in temps}
    assert {cid: r.read() for cid, r in readers.items()} == {cid: sample.readings[cid].value for cid in temps}
    assert backend.reader(f"{dev.id}/power") is None  # temperatures only
    edge = next(root.rglob("temp1_input"))
    edge.write_text("250000\n")  # 250 °C: implausible for the sample, and for the fast lane alike
    assert readers[f"{dev.id}/temperature"].read() is None
    assert backend.sample().readings[f"{dev.id}/temperature"].status is Status.IMPLAUSIBLE
    for r in readers.values():
        r.close()
    backend.close()


def test_rx7900xtx_has_its_limits_and_rx9070xt_a_firmware_fan(tmp_path):
    _, xtx, sample = read(tree(tmp_path, "rx7900xtx"))
    limit = xtx.knobs[0]
    assert (limit.min, limit.max, limit.default) == (261.0, 333.0, 290.0)
    assert values(xtx, sample)["junction_temperature"] == 61.0
    _, rdna4, sample = read(tree(tmp_path, "rx9070xt"))
    limit, fan = rdna4.knobs
    assert sample.knobs[limit.id].value == 120.0 and limit.default == 304.0  # a user's cap, well below default
    assert not fan.writable and "firmware owns the fan" in fan.why_not
    assert sample.knobs[fan.id].value == pytest.approx(100 * 81 / 255) and sample.knobs[fan.id].mode is None


def test_power_limit_writes_microwatts_and_restores_on_the_same_card(tmp_path):
    root = tree(tmp_path, "rx7900xtx")
    backend, dev, _ = read(root)
    cap = root / "class" / "hwmon" / "hwmon8" / "power1_cap"
    saved = backend.save_knob("gpu0/power_limit")
    assert saved == {"pci": "0000:03:00.0", "cap_uw": 290_000_000}
    backend.write_knob("gpu0/power_limit", 275.0)
    assert cap.read_text() == "275000000\n" and backend.read_knob("gpu0/power_limit").value == 275.0
    with pytest.raises(OutOfRange):
        backend.write_knob("gpu0/power_limit", 400.0)  # above power1_cap_max
    backend.close()
    again = HwmonGpuBackend(str(root), index_base=2)  # an NVIDIA card came first: now it is gpu2
    again.discover()
    again.restore_knob("gpu0/power_limit", saved)  # found by its PCI address, not by the old id
    assert cap.read_text() == "290000000\n"
    again.close()


def test_fan_takes_manual_mode_and_goes_back(tmp_path):
    root = tree(tmp_path, "rx6900xt")
    backend, _, _ = read(root)
    hw = root / "class" / "hwmon" / "hwmon5"
    saved = backend.save_knob("gpu0/fan0")
    backend.write_knob("gpu0/fan0", 40.0)
    assert (hw / "pwm1_enable").read_text().strip() == "1" and (hw / "pwm1").read_text().strip() == "102"
    backend.restore_knob("gpu0/fan0", saved)
    assert (hw / "pwm1_enable").read_text().strip() == "2"
    backend.close()


def test_the_hwmon_backend_leaves_gpu_chips_to_this_one(tmp_path):
    root = tree(tmp_path, "rx6900xt")
    plain = HwmonBackend(str(root), leave=GPU_DRIVERS)
    assert plain.discover() == []
    inv = discover(open_backends(str(root), cpu=False))
    assert [d.id for d in inv.devices] == ["gpu0"]
    assert inv.owner["gpu0/power_limit"].kind == "hwmon-gpu"
    assert inv.owner["gpu0/power_limit"].locator() == {"backend": "hwmon-gpu", "sysfs_root": str(root)}


def test_gpus_are_numbered_after_the_nvidia_ones(tmp_path):
    class TwoNvidia:
        kind = "nvml"

        def discover(self):
            return [Device(f"gpu{i}", DeviceKind.GPU, "NVIDIA") for i in range(2)]

    inv = discover([TwoNvidia(), HwmonGpuBackend(str(tree(tmp_path, "rx9070xt")))])
    assert [d.id for d in inv.devices] == ["gpu0", "gpu1", "gpu2"]
    assert inv.devices[2].name == "AMD GPU 1002:7550"


def test_a_failing_sensor_reads_failed_and_a_vanished_card_is_lost(tmp_path):
    io = FaultIO()
    backend = HwmonGpuBackend(str(tree(tmp_path, "rx6900xt")), io=io)
    backend.discover()
    io.faults["temp2_input"] = [OSError(errno.EIO, "EIO")]
    sample = backend.sample()
    assert sample.readings["gpu0/junction_temperature"].status == Status.FAILED
    assert sample.readings["gpu0/temperature"].value == 56.0 and sample.lost == frozenset()
    io.faults.clear()
    for suffix in ("_input", "_average", "pwm1", "_percent"):  # the card fell off the bus: ENODEV everywhere
        io.faults[suffix] = [OSError(errno.ENODEV, "ENODEV")]
    io.open_faults[""] = [OSError(errno.ENODEV, "ENODEV")]
    assert backend.sample().lost == {"gpu0"}
    backend.close()


def _engine_input(devices, sample, t: float) -> EngineInput:
    return EngineInput(t_mono=t, t_wall=1_767_268_800.0 + t, devices=tuple(devices), readings=sample.readings,
                       knobs=sample.knobs)


def test_the_same_policies_raise_relax_budget_and_keep_it_safe(tmp_path):
    root = tree(tmp_path, "rx7900xtx")
    backend = HwmonGpuBackend(str(root))
    devices = backend.discover()
    raise_ = load_policy_text("rules: [{name: up, kind: gpu_power_limit, gpus: all, limit: max}]", name="up")
    relax = load_policy_text("rules: [{name: down, kind: gpu_power_limit, gpus: {model: 'AMD*'}, limit: 90%}]",
                             name="down")
    budget = load_policy_text("budget: {devices_w: 280}\nrules: [{name: up, kind: gpu_power_limit, limit: max}]",
                              name="budget")
    sample = backend.sample()
    decide = {p.name: evaluate(p, (), _engine_input(devices, sample, 0.0), initial_state()).decisions
              for p in (raise_, relax, budget)}
    assert decide["up"]["gpu0/power_limit"].value == 333.0
    assert decide["down"]["gpu0/power_limit"].value == 261.0  # 90 % of 290 W, clamped to power1_cap_min
    budgeted = decide["budget"]["gpu0/power_limit"]
    assert budgeted.rule == "budget/budget" and 261.0 <= budgeted.value <= 280.0
    hw = root / "class" / "hwmon" / "hwmon8"
    (hw / "temp2_input").write_text("108000\n")  # junction 108 °C: within 5 °C of its 110 °C crit
    hot = evaluate(raise_, (), _engine_input(devices, backend.sample(), 1.0), initial_state()).decisions
    assert hot["gpu0/power_limit"].layer == Layer.SAFETY and hot["gpu0/power_limit"].value == 261.0
    assert hot["gpu0/fan0"].layer == Layer.SAFETY and hot["gpu0/fan0"].value == 100.0
    backend.close()


def xe_tree(root: Path) -> Path:
    """An Intel Arc (xe) card as the xe hwmon ABI describes it (Documentation/ABI/testing/
    sysfs-driver-intel-xe-hwmon): card and package power limits, energy counters, pkg and vram
    temperatures, fan1. Synthetic: no recorded xe tree exists in the project's data."""
    dev = root / "devices" / "pci0000:00" / "0000:03:00.0"
    hw = dev / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    files = {"name": "xe", "power1_max": 200_000_000, "power1_rated_max": 190_000_000, "power1_max_interval": 28000,
             "power2_max": 250_000_000, "power2_rated_max": 230_000_000, "energy1_input": 123_456_789_000,
             "energy2_input": 223_456_789_000, "temp2_input": 47000, "temp2_label": "pkg", "temp3_input": 52000,
             "temp3_label": "vram", "fan1_input": 1200}
    for name, value in files.items():
        (hw / name).write_text(f"{value}\n")
    (dev / "vendor").write_text("0x8086\n")
    (dev / "device").write_text("0xe20b\n")
    os.symlink("../..", hw / "device")
    (root / "class" / "hwmon").mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/0000:03:00.0/hwmon/hwmon3", root / "class" / "hwmon" / "hwmon3")
    return root


def test_an_intel_xe_card(tmp_path):
    backend = HwmonGpuBackend(str(xe_tree(tmp_path / "sys")))
    (dev,) = backend.discover()
    sample = backend.sample()
    assert dev.name == "Intel GPU 8086:e20b"
    assert values(dev, sample) == {"temperature": 47.0, "memory_temperature": 52.0, "energy": 123456.789,
                                   "fan0_rpm": 1200.0}
    (limit,) = dev.knobs
    assert (limit.min, limit.max, limit.default) == (None, None, 190.0)
    assert sample.knobs[limit.id].value == 200.0
    backend.write_knob(limit.id, 150.0)
    assert (tmp_path / "sys" / "class" / "hwmon" / "hwmon3" / "power1_max").read_text() == "150000000\n"
    backend.close()


def two_cards(tmp_path: Path) -> Path:
    """The RX 6900 XT (0000:0b:00.0, hwmon5) and the RX 7900 XTX (0000:03:00.0, hwmon8) in one machine."""
    root = tree(tmp_path / "a", "rx6900xt")
    other = tree(tmp_path / "b", "rx7900xtx")
    os.rename(other / "devices" / "pci0000:00" / "0000:03:00.0", root / "devices" / "pci0000:00" / "0000:03:00.0")
    os.symlink("../../devices/pci0000:00/0000:03:00.0/hwmon/hwmon8", root / "class" / "hwmon" / "hwmon8")
    return root


def unbind(root: Path, bdf: str, hwmon: str) -> None:
    """The card fell off the bus: its PCI device and its hwmon class link are gone."""
    import shutil

    shutil.rmtree(root / "devices" / "pci0000:00" / bdf)
    (root / "class" / "hwmon" / hwmon).unlink()


def test_a_card_that_vanishes_is_lost_and_the_others_keep_their_ids(tmp_path):
    root = two_cards(tmp_path)
    backend = HwmonGpuBackend(str(root))
    first = {d.id: d.info["pci_bus_id"] for d in backend.discover()}
    assert first == {"gpu0": "0000:03:00.0", "gpu1": "0000:0b:00.0"}  # PCI address order
    saved = backend.save_knob("gpu1/power_limit")
    unbind(root, "0000:03:00.0", "hwmon8")
    sample = backend.sample()
    assert sample.lost == {"gpu0"} and sample.readings["gpu1/temperature"].value == 56.0
    assert sample.knobs["gpu0/power_limit"].status == Status.FAILED
    with pytest.raises(DeviceLost):
        backend.write_knob("gpu0/power_limit", 300.0)
    # a hotplug rediscovery: gpu1 stays gpu1 (its policies, journal and history still name it), and gpu0
    # is not handed to another card while this daemon runs
    assert {d.id: d.info["pci_bus_id"] for d in backend.discover()} == {"gpu1": "0000:0b:00.0"}
    backend.write_knob("gpu1/power_limit", 250.0)
    backend.restore_knob("gpu1/power_limit", saved)
    assert backend.read_knob("gpu1/power_limit").value == 289.0
    back = two_cards(tmp_path / "again")  # the card comes back: it gets its id back
    for link in ("hwmon8",):
        os.rename(back / "devices" / "pci0000:00" / "0000:03:00.0", root / "devices" / "pci0000:00" / "0000:03:00.0")
        os.symlink("../../devices/pci0000:00/0000:03:00.0/hwmon/hwmon8", root / "class" / "hwmon" / link)
    assert {d.id: d.info["pci_bus_id"] for d in backend.discover()} == first
    backend.close()


@pytest.mark.parametrize("to_writer", [False, True])
def test_an_amdgpu_fan_found_manual_at_a_low_duty_goes_to_amdgpus_automatic_mode_with_a_note(tmp_path,
                                                                                               to_writer):
    """attack7 H1: the amdgpu fan's PwmKnob had no driver name, so a fan found manual at a low duty went to
    manual 255 (no automatic mode known), silently (the note dropped), and the hand-back flag was dropped."""
    root = tree(tmp_path, "rx6900xt")
    backend, _, _ = read(root)
    hw = root / "class" / "hwmon" / "hwmon5"
    (hw / "pwm1_enable").write_text("1\n")
    (hw / "pwm1").write_text("40\n")  # a crash left it at 16 %
    saved = backend.save_knob("gpu0/fan0")
    backend.write_knob("gpu0/fan0", 80.0)
    note = backend.restore_knob("gpu0/fan0", {**saved, "to_writer": True} if to_writer else saved)
    if to_writer:  # handed back to the program that keeps writing it: as found
        assert note is None and (hw / "pwm1_enable").read_text() == "1\n" and (hw / "pwm1").read_text() == "40\n"
    else:
        assert (hw / "pwm1_enable").read_text() == "2\n" and "automatic mode (enable 2)" in note
    backend.close()
