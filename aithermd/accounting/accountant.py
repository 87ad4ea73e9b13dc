"""One accounting interval: the device energy since the last one, split among the processes that used each
device (:mod:`~aithermd.accounting.attribution`), totalled (:mod:`~aithermd.accounting.ledger`) and summed
per window scope.

Inputs per interval: joules per device (the meter's increments, summed since the last interval), each
GPU's usage (NVML processes, per-process utilization and memory) and each process's CPU seconds. GPU
``gpuN`` is split on its own; the CPU (device ``cpu``) is the sum of the RAPL ``package-N`` zones (not
their core/uncore/dram subzones, nor a second MMIO copy of a zone). A process's CPU time counts from the
scan after it was first seen, or from its start when it started during the interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aithermd.accounting.attribution import Holder, IdleFloor, Split, split_cpu, split_gpu
from aithermd.accounting.ledger import Ledger, group_names
from aithermd.accounting.procs import ProcessInfo, ProcessTable, ProcKey
from aithermd.accounting.windows import parse_scope
from aithermd.model import GpuUsage

CPU = "cpu"
CPU_BUSY_CORES = 0.5  # below half a core of process CPU time, the package counts as idle (floor may rise)
GPU_IDLE_PCT = 5.0  # a GPU whose every process kept each engine under 5 % counts as idle (a desktop's
# compositor holds the display GPU for ever: waiting for a GPU nobody holds would never learn its floor)


def _gpu_idle(u: GpuUsage) -> bool:
    """Nobody holds the GPU, or the driver says none of its holders kept it busy."""
    if not u.processes:
        return True
    if u.utilization is None:
        return False
    return all(max(p.sm_pct, p.encoder_pct, p.decoder_pct) < GPU_IDLE_PCT for p in u.utilization.values())


def is_package_zone(device_id: str) -> bool:
    """``powercap:package-N`` (the first of its name: ``#2`` is the MMIO copy of the same zone)."""
    return device_id.startswith("powercap:package-") and "#" not in device_id


def accounted_device(device_id: str) -> str | None:
    """The accounting's device that a meter device's joules go to: ``gpuN`` itself, a RAPL package zone
    :data:`CPU` (the packages' sum), else None (a subzone, psys, an MMIO copy)."""
    return device_id if device_id.startswith("gpu") else CPU if is_package_zone(device_id) else None


def matches(scope: str, info: ProcessInfo, ancestors: Iterable[int]) -> bool:
    parsed = parse_scope(scope)
    if parsed is None:
        return False
    kind, value = parsed
    cg = info.cgroup
    if kind == "job":
        return cg.slurm_job == int(value)
    if kind == "unit":
        return cg.unit == value
    if kind == "container":
        return cg.container is not None and cg.container.partition(":")[2].startswith(value)
    if kind == "cgroup":
        return cg.path == value or cg.path.startswith(value.rstrip("/") + "/")
    return info.pid == int(value) or int(value) in ancestors


class Accountant:
    """Keeps the idle floors, the CPU-time baseline, the :class:`Ledger` and the last interval's view."""

    def __init__(self, table: ProcessTable, floors: Mapping[str, float] | None = None) -> None:
        self.table = table
        self.floors: dict[str, IdleFloor] = {k: IdleFloor(v) for k, v in (floors or {}).items()}
        self.ledger = Ledger()
        self._cpu_before: dict[ProcKey, float] | None = None
        self._scan_wall: float | None = None
        self.last_usage: dict[str, GpuUsage] = {}
        self.last_splits: dict[str, Split] = {}
        self.last_dt_s = 0.0

    def _floor(self, name: str) -> IdleFloor:
        floor = self.floors.get(name)
        if floor is None:
            floor = self.floors[name] = IdleFloor()
        return floor

    def account(self, t_wall: float, dt_s: float, joules: Mapping[str, float], usage: Sequence[GpuUsage],
                cpu: Mapping[ProcKey, float], identities: Mapping[str, str | None] | None = None,
                scopes: Iterable[str] = (), t_run: float | None = None,
                learn: bool = True) -> dict[str, dict[str, float]]:
        """Account one interval of ``dt_s`` ending at ``t_wall`` (``t_run``: then on the boot clock, which
        times how long exited processes are kept; None: ``t_wall``); ``identities``: {device id: uuid or
        zone} (idle floors follow the board, not its index). ``learn`` False: the interval teaches the idle
        floors nothing (the machine slept in it: its mean draw is the sleep's, attack8 T4). Returns
        {scope: {device: J}} for ``scopes``."""
        identities = identities or {}
        splits: list[Split] = []
        for u in usage:
            energy = joules.get(u.device_id)
            if energy is None:
                continue
            holders = self._holders(u)
            floor = self._floor(identities.get(u.device_id) or u.device_id)
            splits.append(split_gpu(u.device_id, energy, dt_s, floor.value, holders))
            if dt_s > 0 and learn:
                floor.observe(energy / dt_s, dt_s, idle=_gpu_idle(u))
        baseline = self._cpu_before is None  # no CPU times yet: cannot tell an idle CPU from a busy one
        used = self._cpu_used(cpu, t_wall)
        package = [j for d, j in joules.items() if is_package_zone(d)]
        if package:
            energy = math.fsum(package)
            floor = self._floor("rapl:package")
            splits.append(split_cpu(CPU, energy, dt_s, floor.value, used))
            if dt_s > 0 and not baseline and learn:
                floor.observe(energy / dt_s, dt_s, idle=sum(used.values()) / dt_s < CPU_BUSY_CORES)
        t = t_wall if t_run is None else t_run
        for split in splits:
            self.ledger.add(split, self.info, t, dt_s)
        self.ledger.settle(cpu.keys(), t)
        self.last_usage = {u.device_id: u for u in usage}
        self.last_splits = {s.device: s for s in splits}
        self.last_dt_s = dt_s
        return self._per_scope(splits, scopes)

    def info(self, key: ProcKey) -> ProcessInfo:
        return self.table.info.get(key) or self.table.lookup(key[0])

    def _holders(self, u: GpuUsage) -> list[Holder]:
        util = u.utilization
        listed = {p.pid for p in u.processes or ()}
        holders = []
        for p in u.processes or ():
            busy = None if util is None else (util[p.pid].busy if p.pid in util else 0.0)
            holders.append(Holder(self.table.lookup(p.pid).key, busy, p.used_memory_bytes))
        for pid, pu in (util or {}).items():  # busy in the interval, ended before the list was read
            if pid not in listed and pu.busy > 0:
                holders.append(Holder(self.table.lookup(pid).key, pu.busy, 0))
        return holders

    def _cpu_used(self, cpu: Mapping[ProcKey, float], t_wall: float) -> dict[ProcKey, float]:
        before, since = self._cpu_before, self._scan_wall
        self._cpu_before, self._scan_wall = dict(cpu), t_wall
        if before is None or since is None:
            return {}  # the first scan is the baseline
        used = {}
        for key, seconds in cpu.items():
            if key in before:
                used[key] = max(0.0, seconds - before[key])
            elif key[1] >= since - 1.0:  # started during the interval: all its time is new
                used[key] = max(0.0, seconds)
        return used

    def _per_scope(self, splits: Sequence[Split], scopes: Iterable[str]) -> dict[str, dict[str, float]]:
        scopes = list(scopes)
        out: dict[str, dict[str, float]] = {}
        if not scopes:
            return out
        for split in splits:
            for share in split.shares:
                info = self.info(share.key)
                ancestors = list(self.table.ancestors(share.key))
                for scope in scopes:
                    if matches(scope, info, ancestors):
                        per = out.setdefault(scope, {})
                        per[split.device] = per.get(split.device, 0.0) + share.total_j
        return out

    # ---- documents -------------------------------------------------------------------------------------
    def gpu_uids(self, device: str) -> frozenset[int] | None:
        """The uids with a compute process on GPU ``device`` at the last pass (NVML's compute process list,
        kind ``C``, each pid's ``Uid:``; a desktop's graphics process is no job); None when that is not
        known (no such GPU, or its process list could not be read)."""
        u = self.last_usage.get(device)
        if u is None or u.error is not None or u.processes is None:
            return None
        return frozenset(uid for p in u.processes
                         if "C" in p.kinds and (uid := self.table.lookup(p.pid).uid) is not None)

    def gpu_document(self) -> dict[str, Any]:
        """Per GPU: memory, how energy was shared, and its processes now (pid, user, command, unit, job,
        container, kinds, GPU memory, SM %, W over the last interval, J so far)."""
        out: dict[str, Any] = {}
        for device, u in sorted(self.last_usage.items()):
            split = self.last_splits.get(device)
            util = u.utilization or {}
            rows = []
            for p in u.processes or ():
                info = self.table.lookup(p.pid)
                record = self.ledger.processes.get(info.key)
                rows.append({
                    "pid": p.pid, "user": info.user, "command": info.cmdline or info.comm, "comm": info.comm,
                    "kinds": p.kinds, "memory_bytes": p.used_memory_bytes,
                    "sm_pct": round(util[p.pid].sm_pct, 1) if p.pid in util else (None if u.utilization
                                                                                  is None else 0.0),
                    "watts": round(record.watts.get(device, 0.0), 2) if record else 0.0,
                    "joules": round(record.joules.get(device, 0.0), 3) if record else 0.0,
                    "visible": info.visible, **group_names(info)})
            floor = self.floors.get(u.uuid or device)
            out[device] = {"uuid": u.uuid, "memory_used_bytes": u.memory_used_bytes,
                           "memory_total_bytes": u.memory_total_bytes, "processes_error": u.error,
                           "utilization_error": u.utilization_error,
                           "basis": split.basis if split is not None else None,
                           "idle_floor_w": (None if floor is None or floor.value is None
                                            else round(floor.value, 2)),
                           "processes": rows}
        return out

    def process_document(self, limit: int = 50) -> list[dict[str, Any]]:
        """The processes with the most energy so far (running ones and those ended recently)."""
        records = sorted(self.ledger.processes.values(), key=lambda r: r.total_j, reverse=True)[:limit]
        return [{"pid": r.info.pid, "start": r.info.start, "user": r.info.user, "comm": r.info.comm,
                 "command": r.info.cmdline or r.info.comm, "alive": r.alive, **group_names(r.info),
                 "joules": {d: round(j, 3) for d, j in sorted(r.joules.items())},
                 "watts": {d: round(w, 2) for d, w in sorted(r.watts.items())},
                 "basis": dict(r.basis), "total_j": round(r.total_j, 3)} for r in records]

    def floors_json(self) -> dict[str, float]:
        return {k: f.value for k, f in self.floors.items() if f.value is not None}
