"""A journaled knob whose device is absent: not a failure; kept while its device may come back in this boot,
forgotten once it was recorded before a reboot; a root that is no sysfs tree proves nothing; a device
that is there but fails keeps its entry and fails the restore."""

from __future__ import annotations

import json
import shutil

import pytest

from aithermd.actuate.journal import JOURNAL_FILE, Journal, current_boot_id
from aithermd.actuate.restore import restore_journal
from aithermd.cli import main
from aithermd.errors import DeviceLost, UnknownKnob
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.machines import crashed_with_fans
from tests.support.proc import knob_files
from tests.support.stub_engine import STUB_ENGINE

NCT = "hwmon:nct6798-isa-0290"
GONE = "fake:b/pwm1"


def _unknown_for(backend: FakeBackend, *gone: str) -> None:
    """``backend`` answers UnknownKnob for ``gone`` (as hwmon/NVML/RAPL do for a knob they did not find)."""
    real = backend.restore_knob

    def restore_knob(knob_id, saved):
        if knob_id in gone:
            raise UnknownKnob(knob_id)
        real(knob_id, saved)

    backend.restore_knob = restore_knob  # type: ignore[method-assign]


def _journal(tmp_path, recorded_boot: str) -> tuple[Journal, FakeBackend]:
    """fake:a/pwm1 taken (changed) and fake:b/pwm1 of a device since gone, both on one backend."""
    a = FakeBackend("a", start_pwm=50)
    j = Journal(tmp_path)
    j.record(a.kid("pwm1"), a.device_id, a.locator(), a.save_knob(a.kid("pwm1")), 0, boot_id=recorded_boot)
    a.write_knob(a.kid("pwm1"), 100.0)
    j.record(GONE, "fake:b", a.locator(), {"pwm": 9, "enable": 2}, 0, boot_id=recorded_boot)
    _unknown_for(a, GONE)
    return j, a


def test_an_absent_device_in_this_boot_is_kept_and_is_not_a_failure(tmp_path):
    j, a = _journal(tmp_path, "boot-1")
    report = restore_journal(j, backends=[a], boot_id="boot-1")
    assert report.ok and report.restored == (a.kid("pwm1"),) and not report.forgotten
    assert list(report.absent) == [GONE] and "kept until it is back" in report.absent[GONE]
    assert a.pwm["pwm1"] == 50
    assert list(Journal(tmp_path).entries()) == [GONE]  # its original applies if the device comes back


def test_every_entry_recorded_before_a_reboot_is_forgotten_and_nothing_written(tmp_path):
    """attack6 G11: the reboot re-initialised every device; what its firmware set since (a BIOS fan setting
    changed after a crash) stands, present device or not."""
    j, a = _journal(tmp_path, "boot-1")
    a.pwm["pwm1"] = 255  # the new boot's firmware: full speed
    report = restore_journal(j, backends=[a], boot_id="boot-2")
    assert report.ok and report.restored == () and not report.absent
    assert set(report.forgotten) == {a.kid("pwm1"), GONE}
    assert all("earlier boot" in why for why in report.forgotten.values())
    assert a.pwm["pwm1"] == 255 and not Journal(tmp_path).dirty


@pytest.mark.parametrize("recorded, now", [("", "boot-2"), ("boot-1", "")])
def test_an_unknown_boot_never_forgets(tmp_path, recorded, now):
    j, a = _journal(tmp_path, recorded)
    report = restore_journal(j, backends=[a], boot_id=now)
    assert report.ok and list(report.absent) == [GONE] and not report.forgotten
    assert list(Journal(tmp_path).entries()) == [GONE]


def test_a_device_that_is_there_but_fails_keeps_its_entry_and_fails(tmp_path):
    j, a = _journal(tmp_path, "boot-1")
    a.restore_knob = lambda knob_id, saved: (_ for _ in ()).throw(DeviceLost(f"{knob_id}: lost"))
    report = restore_journal(j, backends=[a], boot_id="boot-1")
    assert not report.ok and set(report.failed) == {a.kid("pwm1"), GONE}
    assert not report.absent and not report.forgotten
    assert set(Journal(tmp_path).entries()) == {a.kid("pwm1"), GONE}


def test_entries_carry_the_current_boot_id(tmp_path):
    boot = current_boot_id()
    assert len(boot) == 36  # a UUID from /proc/sys/kernel/random/boot_id
    assert current_boot_id(str(tmp_path / "missing")) == ""
    Journal(tmp_path).record("k", "d", {"backend": "fake"}, {"pwm": 1}, 0)
    assert Journal(tmp_path).entries()["k"].boot_id == boot
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["entries"][0]["boot_id"] == boot


def _journaled(tmp_path):
    return crashed_with_fans(tmp_path)


def test_restore_of_a_removed_chip_exits_0_and_forgets_it_after_a_reboot(tmp_path, capsys):
    root, state, _ = _journaled(tmp_path)
    (root / "class" / "hwmon" / "hwmon1").unlink()  # the nct6798 driver was unbound: its hwmon device gone
    shutil.rmtree(root / "devices" / "platform" / "nct6775.656" / "hwmon")
    assert main(["restore", "--state-dir", str(state)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {NCT}/pwm1: {NCT} not found: kept until it is back" in err and f"{NCT}/pwm2" in err
    assert len(Journal(state).entries()) == 2
    doc = json.loads((state / JOURNAL_FILE).read_text())  # as if recorded before the last reboot
    for e in doc["entries"]:
        e["boot_id"] = "00000000-0000-0000-0000-000000000000"
    (state / JOURNAL_FILE).write_text(json.dumps(doc))
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert f"warning: {NCT}/pwm1: {NCT} was journaled in an earlier boot" in capsys.readouterr().err
    assert not (state / JOURNAL_FILE).exists()


def test_a_root_that_is_no_sysfs_tree_proves_nothing(tmp_path, capsys):
    root, state, original = _journaled(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(empty)]) == 2  # said up front
    assert f"{empty}: not a sysfs tree (no class/ directory)" in capsys.readouterr().err
    assert len(Journal(state).entries()) == 2
    report = restore_journal(Journal(state), sysfs_root=empty)  # the daemon's path: failures, not "absent"
    assert not report.ok and set(report.failed) == {f"{NCT}/pwm1", f"{NCT}/pwm2"} and not report.absent
    assert len(Journal(state).entries()) == 2
    assert main(["restore", "--state-dir", str(state)]) == 0  # the right root still puts them back
    assert knob_files(root) == original


@pytest.mark.parametrize("recorded, left", [(None, ["fake:old/pwm1"]), ("an-earlier-boot", [])])
async def test_the_daemon_stops_clean_with_an_absent_device_in_its_journal(settings, clock, recorded, left):
    b = FakeBackend(start_pwm=40, start_enable=2)
    j = Journal(settings.state_dir)
    # a crashed run had taken a fan of a second chip on the same backend; that chip is absent now
    j.record("fake:old/pwm1", "fake:old", b.locator(), {"pwm": 10, "enable": 2}, 0, boot_id=recorded)
    _unknown_for(b, "fake:old/pwm1")
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)
    assert await d.run(max_ticks=2) == 0
    assert list(Journal(settings.state_dir).entries()) == left
    assert b.pwm == {"pwm1": 40, "pwm2": 40} and b.enable == {"pwm1": 2, "pwm2": 2}


def test_a_chip_back_under_another_driver_name_gets_its_originals(tmp_path, capsys):
    """attack6 G5: after a crash, the nct6798 at ISA 0x290 came back from a driver swap named nct6796: its
    originals stayed "absent" under the old id and the next daemon journaled the crash's manual 20 % as the
    originals. The chip at the same bus address with the same pwm is the same fan."""
    root, state, original = _journaled(tmp_path)
    chip = root / "devices" / "platform" / "nct6775.656" / "hwmon" / "hwmon1"
    (chip / "name").write_text("nct6796\n")
    assert main(["restore", "--state-dir", str(state)]) == 0
    out = capsys.readouterr()
    assert f"{NCT}/pwm1: restored as hwmon:nct6796-isa-0290/pwm1" in out.err and "restored 2 knob(s)" in out.out
    assert knob_files(root) == original and not (state / JOURNAL_FILE).exists()


@pytest.mark.parametrize("known, found", [
    (["hwmon:nct6796-isa-0290/pwm1", "hwmon:nct6796-isa-0290/pwm2"], "hwmon:nct6796-isa-0290/pwm1"),
    (["hwmon:nct6796-isa-0290/pwm2"], None),  # not that pwm
    (["hwmon:it8792-isa-0a60/pwm1"], None),  # another address
    (["hwmon:nct6796-isa-0290/pwm1", "hwmon:nct6687-isa-0290/pwm1"], None),  # two: which one is unknown
])
def test_only_one_chip_at_the_same_address_counts_as_renamed(known, found):
    from aithermd.backends.ids import same_chip_renamed
    assert same_chip_renamed(f"{NCT}/pwm1", known) == found
    assert same_chip_renamed("hwmon:dell_smm-virtual-0/pwm1", ["hwmon:other-virtual-0/pwm1"]) is None
