"""lm-sensors chip names for every bus libsensors knows (lib/sysfs.c, lib/data.c)."""

from __future__ import annotations

import os

import pytest

from aithermd.backends.chipname import chip_name, chip_name_for
from aithermd.backends.ids import natural_key, unique_ids
from aithermd.backends.sysfs import SysfsIO


@pytest.mark.parametrize(
    ("prefix", "dev", "subsystem", "expected", "adapter"),
    [
        ("k10temp", "0000:00:18.3", "pci", "k10temp-pci-00c3", "PCI adapter"),
        ("amdgpu", "0000:0b:00.0", "pci", "amdgpu-pci-0b00", "PCI adapter"),
        ("nvme", "0001:02:00.0", "pci", "nvme-pci-10200", "PCI adapter"),
        ("nct6798", "nct6775.656", "platform", "nct6798-isa-0290", "ISA adapter"),
        ("coretemp", "coretemp.1", "platform", "coretemp-isa-0001", "ISA adapter"),
        (
            "ucsi_source_psy_USBC000:001",
            "ucsi_source_psy_usbc000_.0",
            "platform",
            "ucsi_source_psy_USBC000:001-isa-0000",
            "ISA adapter",
        ),
        (
            "asus",
            "asus-nb-wmi",
            "platform",
            "asus-isa-0000",
            "ISA adapter",
        ),  # '-' stops %[a-z0-9_]: address 0
        ("acpitz", "LNXTHERM:00", "acpi", "acpitz-acpi-0", "ACPI interface"),
        ("jc42", "0-0018", "i2c", "jc42-i2c-0-18", "i2c-0"),
        ("w83627hf", "9191-0290", "i2c", "w83627hf-isa-0290", "ISA adapter"),
        ("max1111", "spi0.1", "spi", "max1111-spi-0-1", "SPI adapter"),
        ("corsairpsu", "0003:1B1C:1C0C.0001", "hid", "corsairpsu-hid-3-1", "HID adapter"),
        ("drivetemp", "5:0:0:0", "scsi", "drivetemp-scsi-5-0", "SCSI adapter"),
        ("stmmac", "stmmac-0:01", "mdio_bus", "stmmac-mdio-1", "MDIO adapter"),
        ("nvme", "nvme0", None, "nvme-isa-0000", "ISA adapter"),  # no subsystem link: platform fallback
        ("k10temp", "0000:00:18.3", None, "k10temp-pci-00c3", "PCI adapter"),
        ("mt7921_phy0", "phy0", "ieee80211", "mt7921_phy0-ieee80211-0", "ieee80211 device"),
    ],
)
def test_chip_names(prefix, dev, subsystem, expected, adapter):
    chip = chip_name(prefix, dev, subsystem)
    assert (str(chip), chip.adapter) == (expected, adapter)


def test_virtual_chip_without_device_link():
    assert str(chip_name("dell_smm", None, None)) == "dell_smm-virtual-0"


def test_i2c_adapter_named_isa_is_isa(tmp_path):
    hw = tmp_path / "devices" / "pci0000:00" / "i2c-1" / "1-002d" / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    os.symlink("../..", hw / "device")
    os.symlink("../../../../../bus/i2c", hw.parent.parent / "subsystem")
    adapter = tmp_path / "class" / "i2c-adapter" / "i2c-1" / "device"
    adapter.mkdir(parents=True)
    (adapter / "name").write_text("SMBus PIIX4 adapter port 0 at 0b00\n")
    chip = chip_name_for(SysfsIO(), str(tmp_path), str(hw), "w83795g")
    assert (str(chip), chip.adapter) == ("w83795g-i2c-1-2d", "SMBus PIIX4 adapter port 0 at 0b00")
    (adapter / "name").write_text("ISA main adapter\n")
    assert str(chip_name_for(SysfsIO(), str(tmp_path), str(hw), "w83795g")) == "w83795g-isa-002d"


def test_unique_ids_and_natural_order():
    assert unique_ids(["a", "b", "a", "a", "a#2"]) == ["a", "b", "a#2", "a#3", "a#2#2"]
    assert sorted(["intel-rapl:10", "intel-rapl:2", "intel-rapl:1:0"], key=natural_key) == [
        "intel-rapl:1:0",
        "intel-rapl:2",
        "intel-rapl:10",
    ]
