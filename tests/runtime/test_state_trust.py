"""The state directory and its journal, lock and operator.json are trusted only when the daemon's own uid
(or root) owns them and nobody else can write them, and never through a symlink (attack6 G3: root
restored a journal planted by uid 65534 into a root-owned file, and truncated a file a planted lock
symlink named). A refused journal is not read: nothing is restored from it, nothing started on it."""

from __future__ import annotations

import json
import os

import pytest
import structlog

from aithermd.actuate.journal import JOURNAL_FILE, Journal, JournalError
from aithermd.cli import main
from aithermd.files import UntrustedStateFile
from aithermd.runtime.instance import LOCK_FILE, InstanceLock, held_by_other
from tests.commands.test_run_and_restore import journaled  # noqa: F401 - the fixture
from tests.runtime.test_control import make, policies  # noqa: F401 - the fixture
from tests.support.machines import copy_machine
from tests.support.proc import knob_files

NOBODY = 65534


def test_restore_refuses_a_journal_in_a_directory_every_user_can_write(journaled, capsys):  # noqa: F811
    root, state, _ = journaled
    after_crash = knob_files(root)
    os.chmod(state, 0o1777)
    assert main(["restore", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"{state}: state directory refused" in err and "mode 1777" in err and "chmod go-w" in err
    assert knob_files(root) == after_crash, "nothing acted on"
    os.chmod(state, 0o700)
    assert main(["restore", "--state-dir", str(state)]) == 0  # once fixed, restored as before


@pytest.mark.parametrize("how", ["owner", "mode", "symlink"])
def test_restore_refuses_a_journal_someone_else_could_have_written(journaled, tmp_path, capsys,  # noqa: F811
                                                                    how):
    root, state, _ = journaled
    after_crash = knob_files(root)
    journal = state / JOURNAL_FILE
    if how == "owner":
        os.chown(journal, NOBODY, NOBODY)
        named = f"owned by uid {NOBODY}"
    elif how == "mode":
        os.chmod(journal, 0o666)
        named = "mode 0666"
    else:
        planted = tmp_path / "planted.json"
        journal.rename(planted)
        journal.symlink_to(planted)
        named = "a symlink"
    assert main(["restore", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert str(journal) in err and named in err
    assert knob_files(root) == after_crash
    with pytest.raises(JournalError, match="refused"):
        Journal(state)


def test_run_refuses_a_state_directory_others_can_write_and_touches_nothing(tmp_path, capsys):
    root = copy_machine(tmp_path)
    before = knob_files(root)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o1777)
    code = main(["run", "--sysfs-root", str(root), "--state-dir", str(state), "--bus", "none",
                 "--metrics-listen", "none"])
    assert code == 1
    assert "mode 1777" in capsys.readouterr().err
    assert knob_files(root) == before and not (state / LOCK_FILE).exists()


def test_the_lock_is_never_taken_through_a_symlink_or_from_another_user(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root-owned secret line\n")
    os.chmod(victim, 0o600)
    (state / LOCK_FILE).symlink_to(victim)
    with pytest.raises(UntrustedStateFile, match="a symlink"):
        InstanceLock(state, tmp_path / "sys", tmp_path / "run").acquire()
    assert victim.read_text() == "root-owned secret line\n", "not truncated, no pid written"
    assert held_by_other(state) is None
    (state / LOCK_FILE).unlink()
    (state / LOCK_FILE).write_text("")
    os.chown(state / LOCK_FILE, NOBODY, NOBODY)
    with pytest.raises(UntrustedStateFile, match=f"owned by uid {NOBODY}"):
        InstanceLock(state, tmp_path / "sys", tmp_path / "run").acquire()


def test_an_operator_file_of_another_user_is_not_acted_on(tmp_path, clock, policies):  # noqa: F811
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    doc = {"active_policy": "quiet", "overrides": {"hwmon:nct/pwm1": {"value": 0, "expires_wall": None}}}
    (state / "operator.json").write_text(json.dumps(doc))
    os.chown(state / "operator.json", NOBODY, NOBODY)
    with structlog.testing.capture_logs() as logs:
        op = make(tmp_path, clock, policies)
    assert op.active == "balanced" and op.override_values() == {}
    assert [e["log_level"] for e in logs if e["event"] == "operator_state_unreadable"] == ["error"]
