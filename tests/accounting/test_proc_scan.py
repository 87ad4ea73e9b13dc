"""The process table read straight from /proc against psutil on this machine's own /proc: the same keys
(pid, start time), parents and CPU seconds, a command name with spaces and parentheses included."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from aithermd.accounting.procs import ProcessTable, ProcReader

TRICKY = "a) b (c"  # comm is anyone's text: /proc/PID/stat shows it between the first '(' and the last ')'


@pytest.fixture
def tricky():
    code = ("import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); print('ok', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, TRICKY], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ok"
    yield proc
    proc.stdin.close()
    proc.wait(10)


def test_the_direct_scan_gives_what_psutil_gives(tricky):
    direct, ps = ProcessTable(), ProcessTable(psutil_module=psutil)
    mine = direct.scan()
    theirs = ps.scan()
    stable = {tricky.pid, os.getpid(), 1}
    for pid in stable:
        key = direct.by_pid[pid]
        assert key == ps.by_pid[pid]  # (pid, create_time rounded to 10 ms), psutil's own formula
        assert direct.info[key].ppid == ps.info[key].ppid
        assert mine[key] == pytest.approx(theirs[key], abs=0.05)  # this process ran between the scans
    assert direct.info[direct.by_pid[tricky.pid]].comm == TRICKY
    assert direct.info[direct.by_pid[tricky.pid]].ppid == os.getpid()
    assert len(set(mine) ^ set(theirs)) <= 4  # processes that started or ended between the two scans


def test_a_process_that_ended_leaves_the_table_and_a_reused_pid_is_a_new_process(tmp_path):
    root = tmp_path / "proc"
    (root / "4242").mkdir(parents=True)
    (root / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    stat = "4242 (python3 (x)) S 1 4242 4242 0 -1 0 0 0 0 0 {u} 30 5 7 20 0 1 0 {start} 0 0\n"
    (root / "4242" / "stat").write_text(stat.format(u=170, start=12345))
    (root / "4242" / "comm").write_text("python3 (x)\n")
    table = ProcessTable(reader=ProcReader(root))
    tick = os.sysconf("SC_CLK_TCK")
    first = table.scan()
    key = (4242, round(1700000000 + 12345 / tick, 2))
    assert first == {key: pytest.approx((170 + 30 + 5 + 7) / tick)}
    assert table.info[key].comm == "python3 (x)" and table.info[key].ppid == 1
    (root / "4242" / "stat").write_text(stat.format(u=170, start=99999))  # the pid reused
    second = table.scan()
    assert list(second) == [(4242, round(1700000000 + 99999 / tick, 2))] and key not in table.info
    (root / "4242" / "stat").unlink()
    assert table.scan() == {} and table.by_pid == {}
