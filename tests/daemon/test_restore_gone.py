"""A journaled knob whose device is gone for good: forgotten once its backend confirms the device absent,
never on a root that proves nothing; a device still there keeps its entry and fails the restore."""

from __future__ import annotations

import shutil

from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.actuate.restore import restore_journal
from aithermd.backends.hwmon import HwmonBackend
from aithermd.cli import main
from aithermd.daemon import Daemon

from .fakes import FakeBackend
from .proc import copy_machine, knob_files
from .stub_engine import STUB_ENGINE

NCT = "hwmon:nct6798-isa-0290"


def _gone(tmp_path, **backend) -> tuple[Journal, FakeBackend, FakeBackend]:
    """A journal with one live knob (fake:a/pwm1, changed) and one of fake:b, a device since removed."""
    a = FakeBackend("a", start_pwm=50)
    j = Journal(tmp_path)
    j.record(a.kid("pwm1"), a.device_id, a.locator(), a.save_knob(a.kid("pwm1")), 0)
    a.write_knob(a.kid("pwm1"), 100.0)
    j.record("fake:b/pwm1", "fake:b", {"backend": "fake", "name": "b"}, {"pwm": 9, "enable": 2}, 0)
    b = FakeBackend("b", fans=0, **backend)  # no pwm1 any more: restore_knob raises
    return j, a, b


def test_an_entry_whose_device_the_backend_no_longer_finds_is_forgotten(tmp_path):
    j, a, b = _gone(tmp_path)
    b.discover = lambda: []  # type: ignore[method-assign] - the device is gone
    report = restore_journal(j, opener=lambda loc: a if loc["name"] == "a" else b)
    assert report.ok and report.restored == (a.kid("pwm1"),)
    assert list(report.forgotten) == ["fake:b/pwm1"] and "fake:b is gone" in report.forgotten["fake:b/pwm1"]
    assert a.pwm["pwm1"] == 50 and not Journal(tmp_path).dirty
    assert b.closed


def test_a_present_device_or_a_failed_discovery_keeps_the_entry(tmp_path):
    j, a, b = _gone(tmp_path)  # b still discovers fake:b (no knob): the device is there, the write failed
    report = restore_journal(j, opener=lambda loc: a if loc["name"] == "a" else b)
    assert not report.ok and set(report.failed) == {"fake:b/pwm1"} and not report.forgotten
    assert list(Journal(tmp_path).entries()) == ["fake:b/pwm1"]

    def broken():
        raise OSError("EIO")

    b.discover = broken  # type: ignore[method-assign]
    report = restore_journal(Journal(tmp_path), opener=lambda loc: b)
    assert set(report.failed) == {"fake:b/pwm1"} and not report.forgotten
    assert list(Journal(tmp_path).entries()) == ["fake:b/pwm1"]


def _journaled(tmp_path):
    root = copy_machine(tmp_path)
    original = knob_files(root)
    state = tmp_path / "state"
    backend = HwmonBackend(str(root))
    backend.discover()
    journal = Journal(state)
    for i in (1, 2):
        kid = f"{NCT}/pwm{i}"
        journal.record(kid, NCT, backend.locator(), backend.save_knob(kid), 0.0)
        backend.write_knob(kid, 100.0)
    backend.close()
    return root, state, original


def test_restore_forgets_the_knobs_of_a_removed_chip_and_exits_0(tmp_path, capsys):
    root, state, _ = _journaled(tmp_path)
    (root / "class" / "hwmon" / "hwmon1").unlink()  # the nct6798 driver was unbound: its hwmon device gone
    shutil.rmtree(root / "devices" / "platform" / "nct6775.656" / "hwmon")
    assert main(["restore", "--state-dir", str(state)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {NCT}/pwm1: device {NCT} is gone" in err and f"warning: {NCT}/pwm2" in err
    assert not (state / JOURNAL_FILE).exists()
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_a_root_that_is_no_sysfs_tree_proves_nothing(tmp_path, capsys):
    root, state, original = _journaled(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["restore", "--state-dir", str(state), "--sysfs-root", str(empty)]) == 1
    assert f"error: {NCT}/pwm1" in capsys.readouterr().err
    assert len(Journal(state).entries()) == 2
    assert main(["restore", "--state-dir", str(state)]) == 0  # the right root still puts them back
    assert knob_files(root) == original


async def test_the_daemon_forgets_a_gone_device_at_start_and_stops_clean(settings, clock):
    b = FakeBackend(start_pwm=40, start_enable=2)
    j = Journal(settings.state_dir)
    # a crashed run had taken a fan of a second chip on the same backend; that chip is gone now
    j.record("fake:old/pwm1", "fake:old", b.locator(), {"pwm": 10, "enable": 2}, 0)
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)
    assert await d.run(max_ticks=2) == 0
    assert not Journal(settings.state_dir).dirty
    assert b.pwm == {"pwm1": 40, "pwm2": 40} and b.enable == {"pwm1": 2, "pwm2": 2}
