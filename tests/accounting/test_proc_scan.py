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


def _tree(tmp_path, procs):
    """A /proc with ``procs``: {pid: (ppid, comm)}; every process started 100 ticks after boot."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("btime 1700000000\n")
    for pid, (ppid, comm) in procs.items():
        (root / str(pid)).mkdir()
        stat = f"{pid} ({comm}) S {ppid} 0 0 0 -1 0 0 0 0 0 10 20 0 0 20 0 1 0 100\n"
        (root / str(pid) / "stat").write_text(stat)
        (root / str(pid) / "comm").write_text(comm + "\n")
    return root


def test_a_scan_of_some_pids_reads_them_and_their_ancestors_only(tmp_path):
    root = _tree(tmp_path, {1: (0, "systemd"), 90: (1, "slurmstepd"), 100: (90, "python"), 300: (1, "sshd")})
    table = ProcessTable(reader=ProcReader(root))
    cpu = table.scan([100, 4242])  # 4242 ended before the scan
    assert sorted(k[0] for k in cpu) == [1, 90, 100]
    assert [table.info[table.by_pid[p]].comm for p in (100, 90, 1)] == ["python", "slurmstepd", "systemd"]
    assert list(table.ancestors(table.by_pid[100])) == [90, 1]
    assert table.lookup(300).visible is False  # not asked for: not read
    assert sorted(k[0] for k in table.scan()) == [1, 90, 100, 300]


class RecordingTable:
    def __init__(self) -> None:
        self.asked: list = []
        self.info: dict = {}

    def scan(self, *pids):
        self.asked.append(set(pids[0]) if pids else "all")
        return {}

    def lookup(self, pid):
        from aithermd.accounting.procs import ProcessInfo

        return ProcessInfo(pid, 0.0, visible=False)


class Gpus:
    async def ausage(self):
        from aithermd.model import GpuProcess, GpuUsage, ProcessUtilization

        busy = {4200: ProcessUtilization(50, 10, 0, 0, 50, 1)}  # busy, gone from the list since
        return [GpuUsage("gpu0", "GPU-0", (GpuProcess(4100),), busy)]


async def test_gpu_only_accounting_reads_the_gpus_processes_and_a_package_reads_every_process():
    import asyncio

    from aithermd.accounting.service import EnergyService
    from aithermd.model import DeviceKind, Reading, Snapshot
    from tests.accounting.bench import _device
    from tests.support.clock import SimClock

    gpu = _device("gpu0", DeviceKind.GPU, {"uuid": "GPU-0"})
    package = _device("powercap:package-0", DeviceKind.POWERCAP, {"zone": "package-0"})
    for devices, want in (((gpu,), {4100, 4200}), ((gpu, package), "all")):
        clock, table = SimClock(), RecordingTable()
        service = EnergyService(clock, None, table=table, gpus=[Gpus()], interval_s=5.0)
        for seq in range(1, 12):
            readings = {c.id: Reading(c.id, 10.0 * seq) for d in devices for c in d.channels}
            service.on_publish(Snapshot(seq, clock.monotonic(), clock.wall(), devices, readings))
            await asyncio.sleep(0)
            if service._task is not None:
                await service._task
            clock.advance(1.0)
        service.stop()
        assert table.asked and all(a == want for a in table.asked), (devices, table.asked)
