"""CPU backend on procfs: one read of ``stat`` per sample, totals without per-CPU parsing, cpufreq from the
sysfs root; checked on a ``/proc/stat`` recorded on the build VM and against psutil on the live ``/proc``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from aithermd.backends.cpu import CpuBackend, ProcFiles
from aithermd.model import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "proc"


def proc_root(tmp_path: Path) -> Path:
    """A procfs with only the recorded ``stat`` and ``loadavg`` (no cpuinfo: the backend must not need it)."""
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(FIXTURES / "stat-2cpu-vm", root / "stat")
    shutil.copy(FIXTURES / "loadavg-2cpu-vm", root / "loadavg")
    return root


def fields(line: str) -> list[int]:
    return [int(x) for x in line.split()[1:]]


def advance(root: Path, busy: list[int], idle: list[int]) -> None:
    """Add ``busy`` jiffies to user and ``idle`` to idle of cpu0, cpu1 (and their sum to the cpu line)."""
    lines = (root / "stat").read_text().splitlines()
    for n in (0, 1):
        f = fields(lines[n + 1])
        f[0] += busy[n]
        f[3] += idle[n]
        lines[n + 1] = f"cpu{n} " + " ".join(map(str, f))
    f = fields(lines[0])
    f[0] += sum(busy)
    f[3] += sum(idle)
    lines[0] = "cpu  " + " ".join(map(str, f))
    (root / "stat").write_text("\n".join(lines) + "\n")


def test_totals_are_the_first_line_less_guest_time(tmp_path):
    root = proc_root(tmp_path)
    first = fields((root / "stat").read_text().splitlines()[0])
    files = ProcFiles(str(root))
    try:
        (total, idle), = files.times(per_cpu=False)
        assert total == sum(first) - first[8] - first[9]
        assert idle == first[3] + first[4]  # idle + iowait
        assert len(files.times(per_cpu=True)) == 3  # all, cpu0, cpu1
        load = (root / "loadavg").read_text().split()
        assert files.loadavg() == (float(load[0]), float(load[1]), float(load[2]))
    finally:
        files.close()


def test_utilization_between_two_reads_without_per_cpu_channels(tmp_path):
    root = proc_root(tmp_path)
    backend = CpuBackend(proc_root=str(root), sysfs_root=str(tmp_path / "no-sys"))
    (dev,) = backend.discover()
    assert [c.attribute for c in dev.channels] == ["utilization", "load1", "load5", "load15"]
    assert backend.sample().readings["cpu/utilization"].status is Status.STALE  # no time passed
    advance(root, busy=[30, 0], idle=[70, 100])
    r = backend.sample().readings
    assert r["cpu/utilization"].value == pytest.approx(15.0)
    assert "cpu/cpu0" not in r
    backend.close()


def test_per_cpu_channels_when_asked(tmp_path):
    root = proc_root(tmp_path)
    backend = CpuBackend(proc_root=str(root), per_cpu=True)
    (dev,) = backend.discover()
    assert [c.attribute for c in dev.channels][:3] == ["utilization", "cpu0", "cpu1"]
    assert dev.info["logical_cpus"] == 2
    advance(root, busy=[30, 0], idle=[70, 100])
    r = backend.sample().readings
    assert (r["cpu/cpu0"].value, r["cpu/cpu1"].value) == (pytest.approx(30.0), pytest.approx(0.0))
    assert r["cpu/utilization"].value == pytest.approx(15.0)
    backend.close()


def test_frequency_is_the_mean_of_the_cpufreq_policies_in_mhz(tmp_path):
    root = proc_root(tmp_path)
    sys_root = tmp_path / "sys"
    for n, khz in enumerate((3_400_000, 2_200_000)):
        policy = sys_root / "devices" / "system" / "cpu" / "cpufreq" / f"policy{n}"
        policy.mkdir(parents=True)
        (policy / "scaling_cur_freq").write_text(f"{khz}\n")
    backend = CpuBackend(proc_root=str(root), sysfs_root=str(sys_root))
    (dev,) = backend.discover()
    assert dev.channels[-1].attribute == "frequency" and dev.channels[-1].unit == "MHz"
    assert backend.sample().readings["cpu/frequency"].value == pytest.approx(2800.0)
    backend.close()


def test_unreadable_stat_fails_utilization_not_the_daemon(tmp_path):
    root = proc_root(tmp_path)
    backend = CpuBackend(proc_root=str(root))
    backend.discover()
    (root / "stat").write_text("garbage\n")  # same inode: the kept descriptor reads it
    r = backend.sample().readings
    assert r["cpu/utilization"].status is Status.FAILED
    assert r["cpu/load1"].status is Status.OK
    backend.close()


def test_live_proc_agrees_with_psutil():
    files = ProcFiles("/proc")
    try:
        ours = files.times(per_cpu=False)[0]
        ps = psutil.cpu_times()
        theirs = sum(ps) - ps.guest - ps.guest_nice
        hz = os.sysconf("SC_CLK_TCK")  # USER_HZ: psutil reports seconds, procfs jiffies
        assert ours[0] / hz == pytest.approx(theirs, abs=2.0)
        assert ours[1] / hz == pytest.approx(ps.idle + ps.iowait, abs=2.0)
        assert len(files.times(per_cpu=True)) == psutil.cpu_count() + 1
    finally:
        files.close()
