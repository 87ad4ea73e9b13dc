"""Sensors as recorded machines really show them: a chip's own physical range, unlabelled and old-labelled
CPU channels, chips without a name, and the fast lane's reader agreeing with the sample on sentinels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Status
from aithermd.policy import selectors
from aithermd.sim import ttar
from tests.support.machines import copy_machine

from .helpers import TTAR

X570 = "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp"
Z690 = "asus-rog-strix-z690-e-alderlake-coretemp-nvme"
K10 = "hwmon:k10temp-pci-00c3"
CORE = "hwmon:coretemp-isa-0000"


def discover(root: Path):
    backend = HwmonBackend(str(root))
    devices = {d.id: d for d in backend.discover()}
    return backend, devices


def unlabel(hwmon_dir: Path) -> None:
    """The same chip as a kernel that exports no labels shows it (k10temp before Linux 5.6)."""
    for label in hwmon_dir.glob("temp*_label"):
        label.unlink()


def test_coretemp_above_its_own_tjmax_is_implausible(tmp_path):
    """coretemp reports TjMax − readout (readout ≥ 0): Package id 0 above its temp1_crit (100 °C) cannot be
    real, 99 °C can."""
    root = copy_machine(tmp_path, Z690)
    temp1 = root / "devices/platform/coretemp.0/hwmon/hwmon2/temp1_input"
    backend, devices = discover(root)
    try:
        temp1.write_text("105000\n")
        r = backend.sample().readings[f"{CORE}/temp1"]
        assert (r.status, r.value) == (Status.IMPLAUSIBLE, None)
        assert r.detail == "105 °C outside 1…100 °C"  # TjMax above; below, a die above freezing
        temp1.write_text("99000\n")
        assert backend.sample().readings[f"{CORE}/temp1"].value == 99.0
    finally:
        backend.close()


def test_unlabelled_k10temp_channels_get_their_documented_names(tmp_path):
    root = copy_machine(tmp_path, X570)
    unlabel(root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2")
    backend, devices = discover(root)
    backend.close()
    chans = {c.attribute: c for c in devices[K10].channels}
    assert {a: (c.label, c.alias) for a, c in chans.items()} == {
        "temp1": (None, "Tctl"), "temp2": (None, "Tdie"), "temp3": (None, "Tccd1")}
    # the shipped policies name CPU temperatures by label: the alias is selected like one
    picked = selectors.select_temperatures(["Tctl", "Tdie"], list(devices.values()))
    assert [c.id for c in picked] == [f"{K10}/temp1", f"{K10}/temp2"]


def test_labelled_k10temp_channels_keep_their_labels_and_no_alias(tmp_path):
    root = copy_machine(tmp_path, X570)
    backend, devices = discover(root)
    backend.close()
    assert [(c.label, c.alias) for c in devices[K10].channels] == [
        ("Tctl", None), ("Tdie", None), ("Tccd1", None)]


def test_coretemp_physical_id_is_known_as_package_id(tmp_path):
    """node_exporter's recorded coretemp shows the pre-3.15 label 'Physical id 0'."""
    ttar.extract(TTAR / "node-exporter-sys-hwmon-thermal-powercap.ttar", tmp_path)
    backend, devices = discover(tmp_path / "sys")
    backend.close()
    chan = devices["hwmon:coretemp-isa-0001"].channels[0]
    assert (chan.label, chan.alias) == ("Physical id 0", "Package id 0")
    assert selectors.select_temperatures(["Package id *"], [devices["hwmon:coretemp-isa-0001"]]) == [chan]


def test_unlabelled_coretemp_gets_package_and_core_names(tmp_path):
    root = copy_machine(tmp_path, Z690)
    unlabel(root / "devices/platform/coretemp.0/hwmon/hwmon2")
    backend, devices = discover(root)
    backend.close()
    aliases = [c.alias for c in devices[CORE].channels[:3]]
    assert aliases == ["Package id 0", "Core 0", "Core 1"]


def test_a_chip_without_a_name_is_named_after_its_driver(tmp_path):
    root = copy_machine(tmp_path, X570)
    nct = root / "devices/platform/nct6775.656"
    (nct / "hwmon/hwmon1/name").unlink()
    os.makedirs(root / "bus/platform/drivers/nct6775")
    os.symlink("../../../bus/platform/drivers/nct6775", nct / "driver")
    backend, devices = discover(root)
    try:
        dev = devices["hwmon:nct6775-isa-0290"]
        assert dev.name == "nct6775"
        assert len(dev.channels) == 31 and len(dev.knobs) == 6
        assert backend.sample().readings["hwmon:nct6775-isa-0290/temp1"].value == 28.0
    finally:
        backend.close()


def test_a_chip_with_neither_name_nor_driver_is_skipped(tmp_path):
    root = copy_machine(tmp_path, X570)
    (root / "devices/platform/nct6775.656/hwmon/hwmon1/name").unlink()
    backend, devices = discover(root)
    backend.close()
    assert sorted(devices) == ["hwmon:amdgpu-pci-0700", K10]


@pytest.mark.parametrize(("raw", "value"), [(b"127000\n", None), (b"-128000\n", None), (b"64125\n", 64.125)])
def test_the_fast_lane_reader_rejects_what_the_sample_rejects(tmp_path, raw, value):
    root = copy_machine(tmp_path, X570)
    backend, _ = discover(root)
    quick = backend.reader(f"{K10}/temp1")
    try:
        (root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2/temp1_input").write_bytes(raw)
        assert quick.read() == value
        reading = backend.sample().readings[f"{K10}/temp1"]
        assert reading.value == value
    finally:
        quick.close()
        backend.close()


def test_a_cpu_die_at_or_below_freezing_is_implausible_a_board_sensor_is_not(tmp_path):
    """attack4 B6: 0 °C is what a die reads when there is no reading, never a die's temperature on a working
    machine; a board thermistor (nct6798 SYSTIN) may read it."""
    root = copy_machine(tmp_path, X570)
    tctl = root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2/temp1_input"
    backend, devices = discover(root)
    try:
        tctl.write_text("0\n")
        r = backend.sample().readings[f"{K10}/temp1"]
        assert (r.status, r.value) == (Status.IMPLAUSIBLE, None) and r.detail.startswith("0 °C outside 1…")
        tctl.write_text("1000\n")
        assert backend.sample().readings[f"{K10}/temp1"].value == 1.0
    finally:
        backend.close()
