"""Processes on the simulated workstation: who holds each GPU, how busy each keeps it, its CPU time, and
its ``/proc`` files.

:class:`SimProcesses` is what the accounting sees of processes in a simulation: it answers psutil's
``process_iter(["cpu_times"])`` (pass it as ``ProcessTable(psutil_module=...)``), writes each process's
``status``, ``comm``, ``cmdline`` and ``cgroup`` under ``proc_root`` (read by
:class:`~aithermd.accounting.procs.ProcReader` as on a real ``/proc``), and registers it with the fake NVML
(its compute list, its memory). Each :meth:`SimProcesses.step` shares every GPU's utilization among the
processes on it by their weights and records one driver sample per busy process
(:meth:`~aithermd.sim.fake_nvml.FakeNvml.add_process_samples`, timestamps in µs of simulated wall time),
and advances CPU time (each process keeps ``cpu_cores`` busy while its GPUs work, 5 % of that when idle).

:func:`default_scenario` is the default machine's cast, following the workload's phases: a desktop's
compositor on gpu0, and during training a Slurm job on both GPUs sharing gpu1 with a notebook kernel.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aithermd.sim.fake_nvml import FakeNvml

PCpuTimes = namedtuple("PCpuTimes", "user system children_user children_system iowait")


@dataclass
class SimProcess:
    pid: int
    comm: str
    cmdline: list[str]
    cgroup: str  # the /proc/PID/cgroup text
    uid: int = 1000
    ppid: int = 1
    start_wall: float = 0.0
    gpus: dict[int, tuple[float, float]] = field(default_factory=dict)  # index → (memory MiB, weight)
    cpu_cores: float = 1.0
    graphics: bool = False
    cpu_s: float = 0.0


class _PsProcess:
    """What ``psutil.process_iter`` yields, for one simulated process."""

    def __init__(self, proc: SimProcess) -> None:
        self.pid = proc.pid
        self._proc = proc
        self.info: dict[str, Any] = {}

    def create_time(self) -> float:
        return self._proc.start_wall

    def ppid(self) -> int:
        return self._proc.ppid


class SimProcesses:
    """The simulated processes (see the module docstring); ``process_table()`` is what the daemon's energy
    accounting reads them through."""

    def process_table(self) -> Any:
        from aithermd.accounting.procs import ProcessTable, ProcReader

        return ProcessTable(psutil_module=self, reader=ProcReader(self.root, users=USERS))

    def __init__(self, proc_root: str | os.PathLike[str], nvml: FakeNvml) -> None:
        self.root = Path(proc_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.nvml = nvml
        self.processes: dict[int, SimProcess] = {}

    def start(self, proc: SimProcess) -> SimProcess:
        """Start ``proc`` (its GPUs' contexts open, its files appear)."""
        self.processes[proc.pid] = proc
        d = self.root / str(proc.pid)
        d.mkdir(exist_ok=True)
        (d / "comm").write_text(proc.comm[:15] + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in proc.cmdline) + b"\0")
        (d / "cgroup").write_text(proc.cgroup if proc.cgroup.endswith("\n") else proc.cgroup + "\n")
        (d / "status").write_text(f"Name:\t{proc.comm[:15]}\nPPid:\t{proc.ppid}\n"
                                  f"Uid:\t{proc.uid}\t{proc.uid}\t{proc.uid}\t{proc.uid}\n")
        for index, (memory, _w) in proc.gpus.items():
            self.nvml.start_process(index, proc.pid, memory_mib=memory, graphics=proc.graphics,
                                    compute=not proc.graphics)
        return proc

    def stop(self, pid: int) -> None:
        proc = self.processes.pop(pid, None)
        if proc is None:
            return
        for index in proc.gpus:
            self.nvml.stop_process(index, pid)
        for name in ("comm", "cmdline", "cgroup", "status"):
            (self.root / str(pid) / name).unlink(missing_ok=True)
        (self.root / str(pid)).rmdir()

    def step(self, t_wall: float, dt_s: float, gpu_util: Callable[[int], float]) -> None:
        """Advance ``dt_s`` ending at ``t_wall``: each GPU's utilization (``gpu_util(index)``, %) shared by
        weight among its processes, one driver sample each, CPU time."""
        by_gpu: dict[int, list[SimProcess]] = {}
        for proc in self.processes.values():
            for index in proc.gpus:
                by_gpu.setdefault(index, []).append(proc)
        busy: dict[int, float] = {}
        stamp = int(t_wall * 1e6)
        for index, procs in by_gpu.items():
            util = gpu_util(index)
            total = sum(p.gpus[index][1] for p in procs)
            samples = {}
            for p in procs:
                share = util * p.gpus[index][1] / total if total > 0 else 0.0
                samples[p.pid] = (share, share * 0.6, 0.0, 0.0)
                busy[p.pid] = max(busy.get(p.pid, 0.0), min(1.0, util / 100.0))
            self.nvml.add_process_samples(index, stamp, samples)
        for proc in self.processes.values():
            work = busy.get(proc.pid, 1.0 if not proc.gpus else 0.0)
            proc.cpu_s += proc.cpu_cores * dt_s * (0.05 + 0.95 * work)

    # ---- psutil ----------------------------------------------------------------------------------------
    def process_iter(self, attrs: Any = None) -> Iterator[_PsProcess]:
        for proc in list(self.processes.values()):
            ps = _PsProcess(proc)
            ps.info = {"cpu_times": PCpuTimes(proc.cpu_s * 0.9, proc.cpu_s * 0.1, 0.0, 0.0, 0.0)}
            yield ps


USERS = {1000: "you", 1001: "alice", 1002: "bob"}  # the simulated machine's accounts (uid → name)
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0"
NOTEBOOK_CGROUP = "0::/system.slice/jupyter.service"
DESKTOP_CGROUP = ("0::/user.slice/user-1000.slice/user@1000.service/session.slice/"
                  "org.gnome.Shell@wayland.service")


class DefaultScenario:
    """The default machine's processes (see the module docstring): ``update(t_s, training, t_wall)`` before
    each step starts and stops them at the workload's phase changes."""

    def __init__(self, processes: SimProcesses, gpus: int) -> None:
        self.processes, self.gpus = processes, gpus
        self.next_pid, self.next_job = 4100, 4242
        self.job: list[int] = []
        processes.start(SimProcess(1850, "gnome-shell", ["/usr/bin/gnome-shell"], DESKTOP_CGROUP, uid=1000,
                                   gpus={0: (310.0, 0.01)}, cpu_cores=0.05, graphics=True))

    def update(self, training: bool, t_wall: float) -> None:
        if training and not self.job:
            job, self.next_job = self.next_job, self.next_job + 1
            pid = self.next_pid
            self.next_pid += 10
            gpus = {i: (20_000.0, 1.0) for i in range(self.gpus)}
            argv = ["python", "train.py", "--config", "llama-8b.yaml"]
            self.processes.start(SimProcess(pid, "python", argv, SLURM_CGROUP.format(job=job), uid=1001,
                                            start_wall=t_wall, gpus=gpus, cpu_cores=6.0))
            self.job.append(pid)
            if self.gpus > 1:
                notebook = self.next_pid
                self.next_pid += 10
                self.processes.start(SimProcess(notebook, "python", ["python", "-m", "ipykernel_launcher"],
                                                NOTEBOOK_CGROUP, uid=1002, start_wall=t_wall,
                                                gpus={self.gpus - 1: (6_000.0, 0.35)}, cpu_cores=1.0))
                self.job.append(notebook)
        elif not training and self.job:
            for pid in self.job:
                self.processes.stop(pid)
            self.job = []
