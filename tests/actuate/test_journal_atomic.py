"""The journal is replaced atomically: temp file in the state directory, fsync, rename, fsync of the
directory; a failure before the rename leaves the old journal whole and no temp file."""

from __future__ import annotations

import os

import pytest

from aithermd.actuate import journal as journal_mod
from aithermd.actuate.journal import JOURNAL_FILE, Journal, JournalError

LOC = {"backend": "hwmon", "sysfs_root": "/sys"}


def test_write_order_is_temp_fsync_rename_fsync_dir(tmp_path, monkeypatch):
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", "dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def replace(src, dst):
        src_s, dst_s = str(src), str(dst)
        assert os.path.dirname(src_s) == str(tmp_path) and os.path.basename(src_s).startswith(".")
        calls.append(("rename", os.path.basename(dst_s)))
        real_replace(src, dst)

    monkeypatch.setattr(journal_mod.os, "fsync", fsync)
    monkeypatch.setattr(journal_mod.os, "replace", replace)
    Journal(tmp_path).record("hwmon:x/pwm1", "hwmon:x", LOC, {"pwm": 80, "enable": 5}, 1.0)
    assert calls == [("fsync", "file"), ("rename", JOURNAL_FILE), ("fsync", "dir")]


def test_a_failed_rename_keeps_the_old_journal_whole(tmp_path, monkeypatch):
    j = Journal(tmp_path)
    j.record("hwmon:x/pwm1", "hwmon:x", LOC, {"pwm": 80, "enable": 5}, 1.0)
    before = (tmp_path / JOURNAL_FILE).read_bytes()

    def replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod.os, "replace", replace)
    with pytest.raises(JournalError, match="cannot write the journal"):
        j.record("hwmon:x/pwm2", "hwmon:x", LOC, {"pwm": 70, "enable": 5}, 2.0)
    assert (tmp_path / JOURNAL_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [JOURNAL_FILE]
    assert list(j.entries()) == ["hwmon:x/pwm1"]  # memory matches the disk: pwm2 may not be written
