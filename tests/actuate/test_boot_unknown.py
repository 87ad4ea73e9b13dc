"""attack7 H8: with the boot id unreadable (a container or sandbox masking /proc/sys), G11's rule was off both
ways: entries journaled with boot_id "" were never forgotten, and with the current boot id unreadable every
entry of an earlier boot was applied again. A reboot is now proved by the uptime as well (CLOCK_BOOTTIME,
reset only by a boot), and an entry is forgotten only when a reboot is proved: one of this boot never is."""

from __future__ import annotations

import pytest
import structlog

import aithermd.actuate.boot as boot_module
import aithermd.actuate.journal as journal_module
from aithermd.actuate.boot import Boot
from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.actuate.restore import restore_journal
from aithermd.cli import main
from tests.support.machines import crashed_with_fans
from tests.support.proc import knob_files

NCT = "hwmon:nct6798-isa-0290"


@pytest.fixture
def masked(tmp_path, monkeypatch):
    """/proc/sys masked: the boot id cannot be read, as in the sandbox of the finding."""
    monkeypatch.setattr(boot_module, "BOOT_ID_PATH", str(tmp_path / "masked" / "boot_id"))
    return monkeypatch


def _crashed_run(tmp_path, monkeypatch, uptime: float):
    """A daemon took two fans at ``uptime`` s after its boot, then crashed."""
    with monkeypatch.context() as m:
        m.setattr(journal_module, "uptime_s", lambda: uptime)
        return crashed_with_fans(tmp_path, 70.0)


def test_an_unreadable_boot_id_is_journaled_as_unknown_with_the_uptime(tmp_path, masked):
    _, state, _ = _crashed_run(tmp_path, masked, 5000.0)
    entry = Journal(state).entries()[f"{NCT}/pwm1"]
    assert entry.boot_id == "" and entry.uptime_s == 5000.0


def test_after_a_reboot_in_a_masked_sandbox_the_old_boots_entries_are_forgotten(tmp_path, masked, capsys):
    root, state, original = _crashed_run(tmp_path, masked, 5000.0)  # the old boot ran 83 min before its crash
    masked.setattr(boot_module, "uptime_s", lambda: 40.0)  # the new boot: 40 s up
    before = knob_files(root)  # what the new boot's firmware set stands
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert f"{NCT}/pwm1: {NCT} was journaled in an earlier boot" in capsys.readouterr().err
    assert knob_files(root) == before != original and not (state / JOURNAL_FILE).exists()


def test_an_entry_with_a_boot_id_is_forgotten_after_a_reboot_even_when_the_boot_id_is_now_unreadable(
        tmp_path, monkeypatch):
    root, state, original = _crashed_run(tmp_path, monkeypatch, 5000.0)  # recorded with the real boot id
    assert Journal(state).entries()[f"{NCT}/pwm1"].boot_id
    before = knob_files(root)
    monkeypatch.setattr(boot_module, "BOOT_ID_PATH", str(tmp_path / "masked" / "boot_id"))  # masked now
    monkeypatch.setattr(boot_module, "uptime_s", lambda: 40.0)
    report = restore_journal(Journal(state))
    assert report.restored == () and len(report.forgotten) == 2
    assert knob_files(root) == before != original


def test_in_the_same_boot_with_the_id_unreadable_the_originals_are_put_back_and_it_is_said(
        tmp_path, masked):
    root, state, original = _crashed_run(tmp_path, masked, 5000.0)
    masked.setattr(boot_module, "uptime_s", lambda: 5100.0)  # 100 s later, the same boot
    with structlog.testing.capture_logs() as logs:
        report = restore_journal(Journal(state))
    assert report.ok and not report.forgotten and len(report.restored) == 2
    assert knob_files(root) == original and not (state / JOURNAL_FILE).exists()
    (said,) = [e for e in logs if e["event"] == "restore_boot_unknown"]
    assert sorted(said["knobs"]) == [f"{NCT}/pwm1", f"{NCT}/pwm2"]


@pytest.mark.parametrize("recorded, now, up_then, up_now, earlier", [
    ("a", "a", 10.0, 5.0, False),  # same boot id: the ids decide
    ("a", "b", 10.0, 50.0, True),  # ids differ: a reboot
    ("", "b", 5000.0, 40.0, True),  # unknown then: the uptime went back, a reboot
    ("a", "", 5000.0, 40.0, True),  # unknown now: likewise
    ("", "", 5000.0, 40.0, True),
    ("", "", 40.0, 5000.0, False),  # later uptime: this boot, or one that cannot be told: put back
    ("", "b", None, 40.0, False),  # an older journal without the uptime: put back
])
def test_the_rule(recorded, now, up_then, up_now, earlier):
    entry = journal_module.JournalEntry("k", "d", {}, {}, 0.0, recorded, up_then)
    assert Boot(now, up_now).earlier(entry) is earlier
    assert Boot(now, up_now).unsure(entry) is (not earlier and not (recorded and now))
