"""The recorded ttar trees (node_exporter, procfs, telegraf, amdgpu, applesmc) read as lm-sensors would."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Status
from aithermd.sim import ttar

from .helpers import TTAR


def read(root: Path):
    backend = HwmonBackend(str(root))
    try:
        devices = {d.id: d for d in backend.discover()}
        sample = backend.sample()
    finally:
        backend.close()
    return devices, sample


def values(devices, sample, dev_id):
    return {(c.label, c.attribute): sample.readings[c.id].value for c in devices[dev_id].channels}


def test_node_exporter_tree(tmp_path):
    ttar.extract(TTAR / "node-exporter-sys-hwmon-thermal-powercap.ttar", tmp_path)
    devices, sample = read(tmp_path / "sys")
    # hwmon4 has no name, bogus.0 only unknown attributes, both asus chips only pwm1_enable: libsensors
    # skips all of them, and so does aithermd.
    assert list(devices) == [
        "hwmon:coretemp-isa-0000",
        "hwmon:coretemp-isa-0001",
        "hwmon:mt7996_phy0_0-isa-0000",
        "hwmon:mt7996_phy0_1-isa-0000",
        "hwmon:mt7996_phy0_2-isa-0000",
        "hwmon:nct6779-virtual-0",
    ]
    assert values(devices, sample, "hwmon:coretemp-isa-0001") == {
        ("Physical id 0", "temp1"): 55.0,
        ("Core 0", "temp2"): 54.0,
        ("Core 1", "temp3"): 52.0,
        ("Core 2", "temp4"): 53.0,
        ("Core 3", "temp5"): 50.0,
    }
    core = devices["hwmon:coretemp-isa-0000"].channels[0]
    assert dict(core.thresholds) == {"max": 84.0, "crit": 100.0}
    nct = devices["hwmon:nct6779-virtual-0"]
    assert values(devices, sample, nct.id) == {
        (None, "in0"): 0.792,
        (None, "in1"): 1.024,
        (None, "fan2"): 1098.0,
    }
    assert nct.knobs == ()  # pwm1_enable without pwm1 is no knob
    assert dict(nct.channels[0].thresholds) == {"min": 0.0, "max": 1.744}
    assert dict(nct.channels[1].thresholds) == {}  # in1_min = in1_max = 0: unconfigured


def test_procfs_nvme_tree_once_linked_into_class_hwmon(tmp_path):
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path, strip="fixtures")
    root = tmp_path / "sys"
    assert read(root)[0] == {}  # no class/hwmon in this tree: nothing to find
    (root / "class" / "hwmon").mkdir()
    os.symlink(
        "../../devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/hwmon3",
        root / "class" / "hwmon" / "hwmon3",
    )
    devices, sample = read(root)
    assert list(devices) == ["hwmon:nvme-isa-0000"]  # device link to nvme0, no subsystem link: as libsensors
    got = values(devices, sample, "hwmon:nvme-isa-0000")
    assert got[("Composite", "temp1")] == 43.85 and got[("Sensor 8", "temp9")] == 43.85
    sensor1 = devices["hwmon:nvme-isa-0000"].channels[1]
    assert dict(sensor1.thresholds) == {}  # 65261.85 °C max and −273.15 °C min are nonsense


def test_telegraf_tree_hwmon_directories_in_class(tmp_path):
    ttar.extract(TTAR / "telegraf-temp-hwmon-with-device-sysfs.ttar", tmp_path)
    devices, sample = read(tmp_path / "sys")
    assert list(devices) == ["hwmon:nvme-isa-0000", "hwmon:nvme-isa-0000#2", "hwmon:k10temp-pci-00c3"]
    assert values(devices, sample, "hwmon:k10temp-pci-00c3") == {
        ("Tctl", "temp1"): 31.875,
        ("Tccd1", "temp3"): 30.75,
    }
    assert devices["hwmon:nvme-isa-0000#2"].info["bus_path"] == "class/nvme1"  # hwmon1/device → ../../nvme1/


def amdgpu_tree(tmp_path: Path, archive: str, bdf: str, add_name: bool = False) -> Path:
    """Put an amdgpu ``class/drm/cardN`` capture where the kernel keeps it: the PCI device directory
    ``devices/pci0000:00/<bdf>`` with ``hwmon/hwmonN/device`` → the device, ``subsystem`` → bus/pci."""
    raw = tmp_path / "raw"
    entries = ttar.extract(TTAR / archive, raw)
    card = entries[0].path
    root = tmp_path / "sys"
    device = root / "devices" / "pci0000:00" / bdf
    device.parent.mkdir(parents=True)
    shutil.move(raw / card / "device", device)
    os.symlink("../../../bus/pci", device / "subsystem")
    (root / "class" / "hwmon").mkdir(parents=True)
    for hwmon in os.listdir(device / "hwmon"):
        os.symlink("../..", device / "hwmon" / hwmon / "device")
        if add_name and not (device / "hwmon" / hwmon / "name").exists():
            (device / "hwmon" / hwmon / "name").write_text("amdgpu\n")
        os.symlink(f"../../devices/pci0000:00/{bdf}/hwmon/{hwmon}", root / "class" / "hwmon" / hwmon)
    return root


def test_amdgpu_rx6900xt(tmp_path):
    devices, sample = read(amdgpu_tree(tmp_path, "amdgpu-rx6900xt-drm-card-hwmon-sysfs.ttar", "0000:0b:00.0"))
    dev = devices["hwmon:amdgpu-pci-0b00"]
    assert values(devices, sample, dev.id) == {
        ("vddgfx", "in0"): 0.775,
        (None, "fan1"): 0.0,
        ("edge", "temp1"): 56.0,
        ("junction", "temp2"): 59.0,
        ("mem", "temp3"): 54.0,
        ("PPT", "power1"): 36.0,
    }
    assert dict(dev.channels[-1].thresholds) == {"cap": 289.0}
    assert dict(dev.channels[3].thresholds) == {"crit": 110.0, "emergency": 115.0}
    (pwm,) = dev.knobs
    assert (pwm.id, pwm.fan_channel, pwm.min, pwm.max) == (
        "hwmon:amdgpu-pci-0b00/pwm1",
        "hwmon:amdgpu-pci-0b00/fan1",
        0.0,
        100.0,
    )
    assert sample.knobs[pwm.id].value == 0.0 and sample.knobs[pwm.id].mode == "auto"


def test_amdgpu_rx7900xtx_without_name_is_skipped_until_named(tmp_path):
    root = amdgpu_tree(tmp_path, "amdgpu-rx7900xtx-drm-card-hwmon-sysfs.ttar", "0000:03:00.0")
    assert read(root)[0] == {}  # the capture lacks `name`: libsensors ignores such a device too
    (root / "class" / "hwmon" / "hwmon8" / "name").write_text("amdgpu\n")
    devices, sample = read(root)
    got = values(devices, sample, "hwmon:amdgpu-pci-0300")
    assert got[("PPT", "power1")] == 68.0 and got[("mem", "temp3")] == 68.0


def test_amdgpu_rx9070xt_pwm_without_enable(tmp_path):
    devices, sample = read(amdgpu_tree(tmp_path, "amdgpu-rx9070xt-drm-card-hwmon-sysfs.ttar", "0000:03:00.0"))
    dev = devices["hwmon:amdgpu-pci-0300"]
    knob = sample.knobs["hwmon:amdgpu-pci-0300/pwm1"]
    assert knob.mode is None  # no pwm1_enable on this driver
    assert knob.value == pytest.approx(81 * 100 / 255)
    assert sample.readings[f"{dev.id}/fan1"].value == 896.0


def test_applesmc_old_layout_attributes_in_device_dir(tmp_path):
    ttar.extract(TTAR / "imac9-1-applesmc-fan-sysfs.ttar", tmp_path)
    root = tmp_path / "sys"
    smc = root / "devices" / "platform" / "applesmc.768"
    (smc / "hwmon" / "hwmon0").mkdir(parents=True)
    os.symlink("../..", smc / "hwmon" / "hwmon0" / "device")
    os.symlink("../../../bus/platform", smc / "subsystem")
    (root / "class" / "hwmon").mkdir(parents=True)
    os.symlink("../../devices/platform/applesmc.768/hwmon/hwmon0", root / "class" / "hwmon" / "hwmon0")
    devices, sample = read(root)
    dev = devices["hwmon:applesmc-isa-0300"]  # platform device applesmc.768 → address 0x300
    labels = {c.attribute: c.label for c in dev.channels}
    assert labels["fan1"] == "ODD " and labels["temp1"] == "TA0P"  # label text kept exactly
    assert sample.readings[f"{dev.id}/fan3"].value == 1199.0
    assert sample.readings[f"{dev.id}/temp4"].value == 43.0
    for n in (5, 6, 7):  # −127 °C: no sensor behind the SMC key
        assert sample.readings[f"{dev.id}/temp{n}"].status == Status.IMPLAUSIBLE
    assert dict(dev.channels[0].thresholds) == {"min": 800.0, "max": 4800.0}
