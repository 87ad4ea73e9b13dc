"""Ids never depend on the boot-dependent hwmonN number; repeated chips get #2."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aithermd.backends.hwmon import HwmonBackend
from tests.support.machines import copy_machine

from .helpers import MACHINES


def renumber(root: Path, offset: int) -> dict[str, str]:
    """Give every hwmon device a new number (reversed order plus ``offset``), moving both the class link
    and the device-side ``hwmon/hwmonN`` directory; returns old → new names."""
    class_dir = root / "class" / "hwmon"
    old = sorted(os.listdir(class_dir), key=lambda n: int(n[5:]))
    mapping = {name: f"hwmon{offset + i}" for i, name in enumerate(reversed(old))}
    targets = {name: os.readlink(class_dir / name) for name in old}
    for name in old:
        os.unlink(class_dir / name)
    for name, target in targets.items():
        new = mapping[name]
        device_dir = (class_dir / target).resolve()
        if device_dir.name == name and device_dir.parent.name == "hwmon":
            device_dir.rename(device_dir.parent / new)
            target = str(Path(target).parent / new)
        os.symlink(target, class_dir / new)
    return mapping


def snapshot(root: Path):
    backend = HwmonBackend(str(root))
    try:
        devices = backend.discover()
        sample = backend.sample()
    finally:
        backend.close()
    ids = [(d.id, [c.id for c in d.channels], [k.id for k in d.knobs]) for d in devices]
    values = {cid: r.value for cid, r in sample.readings.items()}
    return ids, values


@pytest.mark.parametrize("machine", MACHINES)
def test_ids_are_the_same_when_hwmon_devices_are_renumbered(machine, tmp_path):
    root = copy_machine(tmp_path, machine)
    before = snapshot(root)
    mapping = renumber(root, offset=11)
    assert set(mapping) != set(mapping.values())
    assert sorted(os.listdir(root / "class" / "hwmon")) == sorted(mapping.values())
    after = snapshot(root)
    assert after == before
    assert not any("hwmon1" in i or "hwmon0" in i for i, _, _ in after[0])


def test_identical_chips_get_numbered_in_bus_order(tmp_path):
    """Two k10temp chips on different PCI functions keep their own names; two acpitz zones (both named
    acpitz-acpi-0 by lm-sensors) become acpitz-acpi-0 and acpitz-acpi-0#2 in bus order, whatever hwmonN."""
    root = copy_machine(tmp_path, "asus-rog-strix-z690-e-alderlake-coretemp-nvme")
    acpi = root / "devices" / "LNXSYSTM:00"
    shutil.copytree(acpi / "LNXTHERM:00", acpi / "LNXTHERM:01", symlinks=True)
    (acpi / "LNXTHERM:01" / "hwmon" / "hwmon1").rename(acpi / "LNXTHERM:01" / "hwmon" / "hwmon9")
    (acpi / "LNXTHERM:01" / "hwmon" / "hwmon9" / "temp1_input").write_text("41000\n")
    # the second zone gets the *lower* hwmon number: ordering must still follow the bus path
    os.rename(root / "class" / "hwmon" / "hwmon1", root / "class" / "hwmon" / "hwmon8")
    os.symlink("../../devices/LNXSYSTM:00/LNXTHERM:01/hwmon/hwmon9", root / "class" / "hwmon" / "hwmon0x")
    os.rename(root / "class" / "hwmon" / "hwmon0x", root / "class" / "hwmon" / "hwmon1")
    backend = HwmonBackend(str(root))
    devices = {d.id: d for d in backend.discover()}
    values = backend.sample().readings
    backend.close()
    assert devices["hwmon:acpitz-acpi-0"].info["bus_path"] == "devices/LNXSYSTM:00/LNXTHERM:00"
    assert devices["hwmon:acpitz-acpi-0#2"].info["bus_path"] == "devices/LNXSYSTM:00/LNXTHERM:01"
    assert devices["hwmon:acpitz-acpi-0#2"].chip == "acpitz-acpi-0"
    assert values["hwmon:acpitz-acpi-0/temp1"].value == 27.8
    assert values["hwmon:acpitz-acpi-0#2/temp1"].value == 41.0


def _swap_numbers(root: Path, a: str, b: str) -> None:
    """Drivers reloaded in the other order: chips ``a`` and ``b`` trade their hwmonN numbers (the class
    links and the device-side ``hwmon/hwmonN`` directories both)."""
    class_dir = root / "class" / "hwmon"
    targets = {n: os.readlink(class_dir / n) for n in (a, b)}
    for name, other in ((a, b), (b, a)):
        device_dir = (class_dir / name).resolve()
        device_dir.rename(device_dir.parent / f"{other}.new")
    for name in (a, b):
        os.unlink(class_dir / name)
    for name, other in ((a, b), (b, a)):
        os.symlink(str(Path(targets[name]).parent / other), class_dir / other)
        device_side = (class_dir / other).parent / Path(targets[name]).parent / f"{other}.new"
        device_side.rename(device_side.parent / other)


NCT_PWM1 = "hwmon:nct6798-isa-0290/pwm1"


def _board_fan_taken(tmp_path):
    """The X570 tree with the daemon's backend open and nct6798's pwm1 (hwmon1) taken to 40 %: (root, the
    nct6798 and amdgpu hwmon parents, the backend, the journal)."""
    from aithermd.actuate.applier import Applier
    from aithermd.actuate.journal import Journal
    from aithermd.model import Decision, Layer
    from tests.support.machines import X570

    root = copy_machine(tmp_path, X570)
    nct, amd = root / "devices/platform/nct6775.656/hwmon", root / "devices/pci0000:00/0000:07:00.0/hwmon"
    backend = HwmonBackend(str(root))
    journal = Journal(tmp_path / "state")
    knob = next(k for d in backend.discover() for k in d.knobs if k.id == NCT_PWM1)
    decision = Decision(knob.id, 40.0, Layer.POLICY, "balanced/board-fans")
    Applier(journal).apply(backend, knob, knob.device_id, decision, 40.0, backend.read_knob(knob.id), 1.0)
    assert ((nct / "hwmon1/pwm1").read_text(), (nct / "hwmon1/pwm1_enable").read_text()) == ("102\n", "1\n")
    return root, nct, amd, backend, journal


def test_a_chip_renumbered_under_the_daemon_is_never_written_through_its_old_number(tmp_path):
    """nct6798 was hwmon1 and amdgpu hwmon0; after a reload they trade numbers. The writes and the exit
    restore of the board's pwm1 went through class/hwmon/hwmon1 into the amdgpu's pwm1 (leaving the
    board's fans manual and the GPU's fan at SmartFan mode 5). Now the old path fails (the device is lost
    until rediscovered) and the restore, rediscovering by id, puts back the right chip's fan."""
    from aithermd.actuate.restore import restore_journal
    from aithermd.errors import DeviceLost

    root, nct, amd, backend, journal = _board_fan_taken(tmp_path)
    try:
        _swap_numbers(root, "hwmon0", "hwmon1")
        assert (root / "class/hwmon/hwmon1/name").read_text() == "amdgpu\n"
        with pytest.raises(DeviceLost):
            backend.write_knob(NCT_PWM1, 60.0)
    finally:
        backend.close()
    assert ((amd / "hwmon1/pwm1").read_text(), (amd / "hwmon1/pwm1_enable").read_text()) == ("101\n", "2\n")
    report = restore_journal(journal, sysfs_root=root)
    assert report.ok and report.restored == (NCT_PWM1,)
    assert ((nct / "hwmon0/pwm1").read_text(), (nct / "hwmon0/pwm1_enable").read_text()) == ("93\n", "5\n")
    assert ((amd / "hwmon1/pwm1").read_text(), (amd / "hwmon1/pwm1_enable").read_text()) == ("101\n", "2\n")


def test_the_daemons_own_exit_restore_finds_a_renumbered_chip_by_its_id(tmp_path):
    """With no udev event (a container, a driver reloaded by hand), the daemon's backend still holds the
    chip's old device path: its exit restore failed (restore enable 5: No such file or directory) and the
    board's fan stayed manual until ExecStopPost's `aithermd restore`. It now opens the backend afresh
    for the lost knob and restores it by id."""
    from aithermd.actuate.restore import restore_journal

    root, nct, amd, backend, journal = _board_fan_taken(tmp_path)
    try:
        _swap_numbers(root, "hwmon0", "hwmon1")  # the reload: nct6798 is hwmon0 now
        report = restore_journal(journal, backends=[backend])
    finally:
        backend.close()
    assert report.ok and report.restored == (NCT_PWM1,)
    assert ((nct / "hwmon0/pwm1").read_text(), (nct / "hwmon0/pwm1_enable").read_text()) == ("93\n", "5\n")
    assert ((amd / "hwmon1/pwm1").read_text(), (amd / "hwmon1/pwm1_enable").read_text()) == ("101\n", "2\n")
    assert not journal.dirty
