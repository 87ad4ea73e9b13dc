"""The processes of the machine: CPU time per process and who each one is (``/proc``).

:class:`ProcessTable` scans every process once per accounting interval: one read of ``<proc_root>/PID/stat``
each (proc(5): ppid, utime, stime, cutime, cstime in clock ticks, starttime in ticks since boot, plus
``btime`` of ``<proc_root>/stat``: the figures psutil's ``cpu_times()`` and ``create_time()`` give, read
directly: psutil costs about 40 µs a process where the read costs under 10) and reads, for each process it
has not seen before, its identity from ``<proc_root>/PID``:

- ``status`` (``Uid:`` line, real uid), ``comm``, ``cmdline`` (NUL-separated, shown with spaces, control
  characters replaced: a command line is anyone's text and reaches every user's terminal), ``cgroup``
  (:func:`~aithermd.accounting.cgroups.parse_cgroup`);
- ``environ``, only for ``SLURM_JOB_ID`` and only when the cgroup names no Slurm job: Slurm configured
  without cgroups (``proctrack/linuxproc``) leaves job processes in slurmd's cgroup, and their environment is
  the one place that says which job they belong to (readable by root; nothing else of it is kept).

A process is keyed by (pid, start time): a pid reused by a new process is a new process. NVML lists host
pids; a pid that is not in this table (aithermd in a container without ``hostPID``, or a process that just
ended) gets an identity with ``visible`` False. A table given a ``psutil_module`` (the simulator's) scans
through its ``process_iter(["cpu_times"])`` instead.
"""

from __future__ import annotations

import os
import pwd
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from aithermd.accounting.cgroups import ROOT, CgroupIdentity, parse_cgroup

MAX_CMDLINE = 512
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # USER_HZ, proc(5)
MAX_ENVIRON = 65536
_SLURM_JOB = re.compile(rb"(?:^|\0)SLURM_JOB_ID=([0-9]{1,12})(?:\0|$)")
ProcKey = tuple[int, float]


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Who a process is. ``start``: its start time (s since the epoch, psutil ``create_time``)."""

    pid: int
    start: float
    ppid: int = 0
    uid: int | None = None
    user: str = ""
    comm: str = ""
    cmdline: str = ""
    cgroup: CgroupIdentity = ROOT
    visible: bool = True

    @property
    def key(self) -> ProcKey:
        return (self.pid, self.start)


def printable(text: str, limit: int = MAX_CMDLINE) -> str:
    """``text`` with control characters replaced by ``?``, at most ``limit`` characters."""
    text = text[:limit]
    return "".join("?" if unicodedata.category(ch) == "Cc" else ch for ch in text)


class ProcReader:
    """Identity files of processes under ``proc_root`` (``/proc``, or a recorded or simulated tree)."""

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc",
                 users: dict[int, str] | None = None) -> None:
        self.root = os.fspath(proc_root)
        self._users: dict[int, str] = dict(users or {})  # uid → name, looked up in the passwd database once
        self._btime: float | None = None

    def _read(self, pid: int, name: str, limit: int = 8192) -> bytes | None:
        try:
            with open(os.path.join(self.root, str(pid), name), "rb") as f:
                return f.read(limit)
        except OSError:
            return None

    def user(self, uid: int | None) -> str:
        if uid is None:
            return ""
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except (KeyError, OverflowError):
                name = str(uid)
            self._users[uid] = name
        return name

    def boot_time(self) -> float:
        """``btime`` of ``<proc_root>/stat`` (s since the epoch), read once; 0.0 when it cannot be read."""
        bt = self._btime
        if bt is None:
            raw = self._read_path(os.path.join(self.root, "stat"), 1 << 16) or b""
            text = raw.decode("ascii", "replace")
            bt = next((float(line.split()[1]) for line in text.splitlines()
                       if line.startswith("btime ") and len(line.split()) > 1), 0.0)
            self._btime = bt
        return bt

    def stats(self) -> Iterator[tuple[int, int, float, float]]:
        """(pid, ppid, start time s since the epoch, CPU s: user + system with reaped children's) of every
        process under the root, from its ``stat`` (proc(5)); a process that ends meanwhile is left out."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if name.isdigit() and (got := self.stat(int(name))) is not None:
                yield got

    def stat(self, pid: int) -> tuple[int, int, float, float] | None:
        """What :meth:`stats` gives for ``pid``; None when it is not running (its ``stat`` unreadable)."""
        raw = self._read_path(os.path.join(self.root, str(pid), "stat"), 4096)
        if raw is None:
            return None
        fields = raw[raw.rfind(b")") + 2:].split()  # after "pid (comm) ": comm may hold spaces and ')'
        tick = CLK_TCK
        try:
            cpu = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
            return pid, int(fields[1]), self.boot_time() + int(fields[19]) / tick, cpu
        except (IndexError, ValueError):
            return None

    @staticmethod
    def _read_path(path: str, limit: int) -> bytes | None:
        try:
            with open(path, "rb", buffering=0) as f:
                return f.read(limit)
        except OSError:
            return None

    def identity(self, pid: int, start: float, ppid: int = 0) -> ProcessInfo:
        """The process's identity; what cannot be read stays empty (a process that ended meanwhile)."""
        uid = None
        status = self._read(pid, "status")
        if status is not None:
            for line in status.decode("utf-8", "replace").splitlines():
                if line.startswith("Uid:"):
                    fields = line.split()
                    if len(fields) > 1 and fields[1].isdigit():
                        uid = int(fields[1])
                    break
        comm = (self._read(pid, "comm", 64) or b"").decode("utf-8", "replace").strip()
        raw = self._read(pid, "cmdline", 4 * MAX_CMDLINE) or b""
        cmdline = " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p)
        cgroup_text = self._read(pid, "cgroup", 16384)
        cgroup = parse_cgroup(cgroup_text.decode("utf-8", "replace")) if cgroup_text else ROOT
        if cgroup.slurm_job is None:
            environ = self._read(pid, "environ", MAX_ENVIRON)
            m = _SLURM_JOB.search(environ) if environ else None
            if m:
                cgroup = replace(cgroup, slurm_job=int(m.group(1)))
        visible = status is not None or cgroup_text is not None
        return ProcessInfo(pid, start, ppid, uid, self.user(uid), printable(comm, 64), printable(cmdline),
                           cgroup, visible)


class ProcessTable:
    """CPU seconds per process and identities, scanned from ``reader``'s ``/proc`` (or through
    ``psutil_module``, the simulator's, when one is given)."""

    def __init__(self, psutil_module: Any = None, reader: ProcReader | None = None) -> None:
        self._ps = psutil_module
        self.reader = reader or ProcReader()
        self.info: dict[ProcKey, ProcessInfo] = {}
        self.by_pid: dict[int, ProcKey] = {}
        # pid → identity of the processes gone at the last two scans (NVML's utilization samples of a
        # process that ended between two passes still name it: charge its job, not an anonymous pid)
        self._exited: dict[int, ProcessInfo] = {}
        self._gone: dict[int, ProcessInfo] = {}

    def _set(self, info: dict[ProcKey, ProcessInfo], by_pid: dict[int, ProcKey]) -> None:
        gone = {k[0]: i for k, i in self.info.items() if k not in info and k[0] not in by_pid}
        self._exited = {p: i for p, i in {**self._gone, **gone}.items() if p not in by_pid}
        self._gone = gone
        self.info, self.by_pid = info, by_pid

    def scan(self, pids: Iterable[int] | None = None) -> dict[ProcKey, float]:
        """{key: CPU seconds so far (user + system, with reaped children's)} of every process now (of
        ``pids`` and their ancestors only, when given: what GPU-only accounting needs, see
        :meth:`EnergyService.account <aithermd.accounting.service.EnergyService.account>`); the
        identities of new ones are read into :attr:`info`, those of ended ones (or left out) dropped."""
        if self._ps is not None:
            return self._scan_psutil()
        cpu: dict[ProcKey, float] = {}
        by_pid: dict[int, ProcKey] = {}
        info: dict[ProcKey, ProcessInfo] = {}
        known_info, reader = self.info, self.reader
        for pid, ppid, start, seconds in (reader.stats() if pids is None else self._lineage(pids)):
            key = (pid, round(start, 2))
            cpu[key] = seconds
            by_pid[pid] = key
            known = known_info.get(key)
            info[key] = known if known is not None else reader.identity(pid, key[1], ppid)
        self._set(info, by_pid)
        return cpu

    def _lineage(self, pids: Iterable[int]) -> Iterator[tuple[int, int, float, float]]:
        """:meth:`ProcReader.stat` of each of ``pids`` and of its parent, the parent's parent, … once each."""
        todo, seen = list(pids), set()
        while todo:
            pid = todo.pop()
            if pid in seen or pid <= 0:
                continue
            seen.add(pid)
            got = self.reader.stat(pid)
            if got is not None:
                yield got
                todo.append(got[1])

    def _scan_psutil(self) -> dict[ProcKey, float]:
        cpu: dict[ProcKey, float] = {}
        by_pid: dict[int, ProcKey] = {}
        info: dict[ProcKey, ProcessInfo] = {}
        for proc in self._ps.process_iter(["cpu_times"]):
            times = proc.info.get("cpu_times")
            if times is None:  # AccessDenied, or it ended meanwhile
                continue
            try:
                key = self._key(proc)
            except Exception:  # noqa: BLE001 - psutil.Error: it ended meanwhile
                continue
            cpu[key] = float(times[0] + times[1] + getattr(times, "children_user", 0.0)
                             + getattr(times, "children_system", 0.0))
            by_pid[key[0]] = key
            known = self.info.get(key)
            if known is None:
                try:
                    ppid = int(proc.ppid())
                except Exception:  # noqa: BLE001
                    ppid = 0
                known = self.reader.identity(key[0], key[1], ppid)
            info[key] = known
        self._set(info, by_pid)
        return cpu

    @staticmethod
    def _key(proc: Any) -> ProcKey:
        return (int(proc.pid), round(float(proc.create_time()), 2))

    def lookup(self, pid: int) -> ProcessInfo:
        """The identity of ``pid`` as of the last scan (or of one of the two before, for a process that
        ended since: attack8 T6); an invisible one when it is in none of them."""
        key = self.by_pid.get(pid)
        if key is not None:
            return self.info[key]
        exited = self._exited.get(pid)
        if exited is not None:
            return exited
        return ProcessInfo(pid, 0.0, visible=False, comm=f"pid {pid}")

    def ancestors(self, key: ProcKey) -> Iterable[int]:
        """Pids of ``key``'s parent, its parent, … (as of the last scan)."""
        seen: set[int] = set()
        info = self.info.get(key)
        if info is None and (exited := self._exited.get(key[0])) is not None and exited.key == key:
            info = exited  # ended since the last scan: its parents as they were
        while info is not None and info.ppid and info.ppid not in seen:
            seen.add(info.ppid)
            yield info.ppid
            parent = self.by_pid.get(info.ppid)
            info = self.info.get(parent) if parent is not None else None
