"""One daemon per machine: a second one on the same state directory, or on the same hardware with another
state directory, refuses to start before it reads anything (whatever the bus says), names the first one's
pid, and leaves the first one's knobs alone; ``aithermd restore`` refuses under a running daemon."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import structlog

from aithermd.runtime.daemon import Daemon
from aithermd.runtime.instance import AlreadyRunning, InstanceLock, held_by_other, machine_lock_path
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


def test_the_same_state_directory_or_the_same_sysfs_root_is_locked(tmp_path):
    first = InstanceLock(tmp_path / "a", tmp_path / "sys", tmp_path / "run")
    first.acquire()
    try:
        for other in (InstanceLock(tmp_path / "a", tmp_path / "elsewhere", tmp_path / "run"),
                      InstanceLock(tmp_path / "b", tmp_path / "sys", tmp_path / "run")):
            with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
                other.acquire()
        assert held_by_other(tmp_path / "a") == f"another aithermd (pid {os.getpid()})"
        InstanceLock(tmp_path / "c", tmp_path / "other-sys", tmp_path / "run").acquire()  # another machine
    finally:
        first.release()
    assert held_by_other(tmp_path / "a") is None
    assert machine_lock_path(tmp_path, "/sys").name == "aithermd.lock"


async def test_a_second_daemon_refuses_before_touching_the_journal(tmp_path, settings, clock):
    settings = settings.replace(**{"runtime_dir": tmp_path / "run"})
    backend = FakeBackend(start_pwm=100, start_enable=2)
    first = Daemon(settings, clock=clock, backends=[backend], sleep=clock.sleep, engine=STUB_ENGINE)
    seen = []

    async def second_daemon(state_dir) -> tuple[int, list]:
        second = Daemon(settings.replace(**{"state_dir": state_dir}), clock=clock, backends=[backend],
                        sleep=clock.sleep, engine=STUB_ENGINE)
        with structlog.testing.capture_logs() as logs:
            code = await second.run(max_ticks=3)
        return code, [e for e in logs if e["event"] == "already_running"], second.tick

    def step():
        if first.hub.latest.seq == 2 and not seen:
            loop = asyncio.get_running_loop()
            seen.append(dict(backend.pwm))
            seen.append(loop.create_task(second_daemon(settings.state_dir)))  # same journal
            seen.append(loop.create_task(second_daemon(tmp_path / "other")))  # same machine, other journal
        if first.hub.latest.seq == 6:
            seen.append(dict(backend.pwm))
        return first.hub.latest.seq >= 6

    assert await first.run(until=step) == 0
    before, same_dir, same_machine = seen[0], await seen[1], await seen[2]
    for code, logs, tick in (same_dir, same_machine):
        assert code == 1 and tick is None, "it stopped before building anything"
        assert len(logs) == 1 and f"pid {os.getpid()}" in logs[0]["error"]
    assert "state directory" in same_dir[1][0]["error"] and "this machine" in same_machine[1][0]["error"]
    assert seen[3] == before and before["pwm1"] == 153, "the first daemon's settings stayed in force"


def test_restore_refuses_under_a_running_daemon(tmp_path):
    lock = InstanceLock(tmp_path / "state", tmp_path / "sys", tmp_path / "run")
    lock.acquire()
    try:
        (tmp_path / "state" / "journal.json").write_text("{}")
        done = subprocess.run([sys.executable, "-m", "aithermd", "restore", "--state-dir",
                               str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "is running on" in done.stderr and "nothing restored" in done.stderr
    finally:
        lock.release()
