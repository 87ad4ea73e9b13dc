"""The journal: atomic, durable, never overwrites an original; restore puts every knob back."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from aithermd.actuate.journal import JOURNAL_FILE, Journal, JournalError
from aithermd.actuate.restore import restore_journal, restore_one
from aithermd.errors import BackendError
from tests.support.fake_backend import FakeBackend


def test_record_persists_and_never_overwrites(tmp_path):
    j = Journal(tmp_path / "state")
    assert not j.dirty and not (tmp_path / "state" / JOURNAL_FILE).exists()
    assert j.record("fake:a/pwm1", "fake:a", {"backend": "fake", "name": "a"}, {"pwm": 100, "enable": 2}, 5.0)
    loc = {"backend": "fake", "name": "a"}
    assert not j.record("fake:a/pwm1", "fake:a", loc, {"pwm": 255, "enable": 1}, 6.0)
    again = Journal(tmp_path / "state")
    entry = again.entries()["fake:a/pwm1"]
    assert entry.saved == {"pwm": 100, "enable": 2}
    assert entry.locator == {"backend": "fake", "name": "a"}
    assert entry.recorded_wall == 5.0
    mode = stat.S_IMODE(os.stat(tmp_path / "state" / JOURNAL_FILE).st_mode)
    assert mode == 0o600


def test_forget_and_clear_remove_the_file(tmp_path):
    j = Journal(tmp_path)
    j.record("k1", "d", {"backend": "fake", "name": "a"}, {"pwm": 1, "enable": 2}, 0)
    j.record("k2", "d", {"backend": "fake", "name": "a"}, {"pwm": 2, "enable": 2}, 0)
    j.forget("k1")
    assert list(Journal(tmp_path).entries()) == ["k2"]
    j.clear()
    assert not (tmp_path / JOURNAL_FILE).exists()
    assert not Journal(tmp_path).dirty


def test_leftover_temp_files_are_removed_and_the_journal_kept(tmp_path):
    j = Journal(tmp_path)
    j.record("k1", "d", {"backend": "fake", "name": "a"}, {"pwm": 1, "enable": 2}, 0)
    (tmp_path / f".{JOURNAL_FILE}.abc.tmp").write_text("{torn")
    j2 = Journal(tmp_path)
    assert list(j2.entries()) == ["k1"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_corrupt_journal_is_an_error_not_an_empty_journal(tmp_path):
    (tmp_path / JOURNAL_FILE).write_text("{not json")
    with pytest.raises(JournalError, match="not a journal"):
        Journal(tmp_path)


@pytest.mark.parametrize(("text", "why"), [
    ("[]", "not a JSON object with a list of 'entries'"),
    ('{"entries": {"a": 1}}', "not a JSON object with a list of 'entries'"),
    ('{"entries": [1]}', "entry 0 is not an object with knob_id, locator, saved"),
    ('{"entries": [{"knob_id": "k", "locator": {}, "saved": {}}, {"knob_id": "j"}]}',
     "entry 1 is not an object with knob_id, locator, saved"),
    ("\xff", "not JSON: "),
])
def test_a_journal_of_the_wrong_shape_says_what_is_wrong_not_a_python_error(tmp_path, text, why):
    """'[]' said "not a journal (list indices must be integers or slices, not str)"."""
    (tmp_path / JOURNAL_FILE).write_text(text, encoding="latin-1")
    with pytest.raises(JournalError) as info:
        Journal(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / JOURNAL_FILE}: not a journal ({why}")
    assert str(info.value).endswith("; 'aithermd restore' moves it aside and hands every fan left in manual "
                                    "mode at a low duty to its driver's automatic mode")
    moved = Journal(tmp_path, quarantine=True)  # the daemon and `aithermd restore` (attack6 G1)
    assert not moved.dirty and moved.lost.startswith(f"{tmp_path / JOURNAL_FILE}: not a journal ({why}")
    assert "the originals it held are lost" in moved.lost and not (tmp_path / JOURNAL_FILE).exists()
    (aside,) = tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*")
    assert aside.read_bytes() == text.encode("latin-1") and Journal(tmp_path).lost is None


def test_unwritable_state_dir_raises_journal_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(JournalError, match="cannot write"):
            Journal(ro).record("k", "d", {}, {}, 0)
    finally:
        ro.chmod(0o700)


def _journal_with(backend: FakeBackend, tmp_path, knobs=("pwm1", "pwm2")) -> Journal:
    j = Journal(tmp_path)
    for name in knobs:
        kid = backend.kid(name)
        j.record(kid, backend.device_id, backend.locator(), backend.save_knob(kid), 0)
    return j


def test_restore_with_open_backends_puts_every_value_and_mode_back(tmp_path):
    b = FakeBackend(start_pwm=77, start_enable=2)
    j = _journal_with(b, tmp_path)
    b.write_knob(b.kid("pwm1"), 100.0)
    b.write_knob(b.kid("pwm2"), 0.0)
    report = restore_journal(j, backends=[b])
    assert report.ok and set(report.restored) == {b.kid("pwm1"), b.kid("pwm2")}
    assert b.pwm == {"pwm1": 77, "pwm2": 77} and b.enable == {"pwm1": 2, "pwm2": 2}
    assert not j.dirty and not b.closed  # the daemon's own backend is not closed
    # idempotent: a second restore finds nothing to do and changes nothing
    assert restore_journal(Journal(tmp_path), backends=[b]).restored == ()


def test_restore_opens_backends_from_their_locators_and_closes_them(tmp_path):
    live = FakeBackend("a", start_pwm=10)
    _journal_with(live, tmp_path)
    live.write_knob(live.kid("pwm1"), 100.0)
    opened = []

    def opener(locator):
        assert locator == {"backend": "fake", "name": "a"}
        opened.append(live)
        return live

    report = restore_journal(Journal(tmp_path), opener=opener)
    assert report.ok and len(opened) == 1 and live.closed
    assert live.pwm["pwm1"] == 10


def test_a_failed_restore_keeps_that_entry_and_forgets_the_rest(tmp_path):
    b = FakeBackend(start_pwm=50)
    j = _journal_with(b, tmp_path)

    def restore_knob(knob_id, saved, _orig=b.restore_knob):
        if knob_id.endswith("pwm2"):
            raise BackendError("EIO")
        _orig(knob_id, saved)

    b.restore_knob = restore_knob  # type: ignore[method-assign]
    report = restore_journal(j, backends=[b])
    assert report.restored == (b.kid("pwm1"),)
    assert set(report.failed) == {b.kid("pwm2")} and "EIO" in report.failed[b.kid("pwm2")]
    assert list(Journal(tmp_path).entries()) == [b.kid("pwm2")]


def test_an_unopenable_backend_fails_its_entries_only(tmp_path):
    b = FakeBackend("a", start_pwm=50)
    j = _journal_with(b, tmp_path, ("pwm1",))
    j.record("fake:gone/pwm1", "fake:gone", {"backend": "fake", "name": "gone"}, {"pwm": 1, "enable": 2}, 0)

    def opener(locator):
        if locator["name"] == "gone":
            raise FileNotFoundError("no such device")
        return b

    report = restore_journal(j, opener=opener)
    assert report.restored == (b.kid("pwm1"),)
    assert "no such device" in report.failed["fake:gone/pwm1"]


def test_sysfs_root_override_rewrites_locators(tmp_path):
    j = Journal(tmp_path)
    j.record("hwmon:x/pwm1", "hwmon:x", {"backend": "hwmon", "sysfs_root": "/old"}, {"pwm": 1}, 0)
    seen = []
    b = FakeBackend()
    b.restore_knob = lambda knob_id, saved: seen.append((knob_id, saved))  # type: ignore[method-assign]

    def opener(locator):
        seen.append(locator)
        return b

    assert restore_journal(j, opener=opener, sysfs_root=tmp_path / "new").ok
    assert seen[0] == {"backend": "hwmon", "sysfs_root": str(tmp_path / "new")}


def test_restore_one_forgets_only_that_knob(tmp_path):
    b = FakeBackend(start_pwm=33)
    j = _journal_with(b, tmp_path)
    b.write_knob(b.kid("pwm1"), 90.0)
    restore_one(j, b, b.kid("pwm1"))
    assert b.pwm["pwm1"] == 33 and b.enable["pwm1"] == 2
    assert list(j.entries()) == [b.kid("pwm2")]
    assert json.loads((tmp_path / JOURNAL_FILE).read_text())["entries"][0]["knob_id"] == b.kid("pwm2")


def test_a_journal_moved_aside_twice_in_a_second_keeps_both_copies(tmp_path):
    """attack7 H5: the second move overwrote the first .corrupt file, the one holding the originals."""
    for text in ("{torn", "[also torn"):
        (tmp_path / JOURNAL_FILE).write_text(text)
        assert Journal(tmp_path, quarantine=True).lost is not None
    assert sorted(p.read_text() for p in tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*")) == ["[also torn", "{torn"]


def test_a_journal_that_cannot_be_moved_aside_still_makes_the_fans_safe(tmp_path, monkeypatch):
    """attack7 H4: on a file system remounted read-only after the error that tore the journal, the move
    failed, JournalError was raised, and no fan was made safe."""
    (tmp_path / JOURNAL_FILE).write_text("{torn")

    def refuse(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("aithermd.actuate.journal.os.link", refuse)
    j = Journal(tmp_path, quarantine=True)
    assert not j.dirty and "cannot be moved aside (Read-only file system) and stays" in j.lost
    assert "every fan found in manual mode at a low duty goes to its driver's automatic mode" in j.lost
