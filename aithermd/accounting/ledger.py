"""Running totals of attributed energy: per process, per systemd unit, per Slurm job, per container, and
per device what stayed idle or unattributed. Fed one :class:`~aithermd.accounting.attribution.Split` per
device and interval; memory stays bounded.

Bounds: a process's record lives while it runs and ``keep_exited_s`` after, on the boot clock the energy
service gives (an NTP step of the wall clock neither keeps nor drops it; its joules stay in its unit,
job and container); at most ``max_processes`` records (the exited ones with the least energy go first).
Each group kind keeps at most ``max_groups`` entries; beyond that the least recently active one's totals
move into its kind's ``"other"`` entry, so totals never shrink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aithermd.accounting.attribution import Split
from aithermd.accounting.procs import ProcessInfo, ProcKey

GROUP_KINDS = ("unit", "job", "container")
OTHER = "other"


def group_names(info: ProcessInfo) -> dict[str, str]:
    """The groups a process counts in: ``unit`` (systemd unit, else ``-``), ``job`` (``slurm:N``) and
    ``container`` (``runtime:ID12``) where it has them."""
    cg = info.cgroup
    out = {"unit": cg.unit or "-"}
    if cg.slurm_job is not None:
        out["job"] = f"slurm:{cg.slurm_job}"
    if cg.container is not None:
        out["container"] = cg.container_short or cg.container
    return out


@dataclass
class ProcessRecord:
    info: ProcessInfo
    first_seen: float
    last_seen: float
    alive: bool = True
    joules: dict[str, float] = field(default_factory=dict)  # device → J (active + idle share)
    idle_j: dict[str, float] = field(default_factory=dict)  # device → J of it that is idle share
    basis: dict[str, str] = field(default_factory=dict)  # GPU device → how it was shared
    watts: dict[str, float] = field(default_factory=dict)  # device → W over the last interval

    @property
    def total_j(self) -> float:
        return sum(self.joules.values())


@dataclass
class Group:
    joules: dict[str, float] = field(default_factory=dict)
    last_active: float = 0.0
    first_seen: float = 0.0
    users: set[str] = field(default_factory=set)


class Ledger:
    def __init__(self, *, keep_exited_s: float = 600.0, max_processes: int = 512,
                 max_groups: int = 1000) -> None:
        self.keep_exited_s = keep_exited_s
        self.max_processes = max_processes
        self.max_groups = max_groups
        self.processes: dict[ProcKey, ProcessRecord] = {}
        self.groups: dict[str, dict[str, Group]] = {k: {} for k in GROUP_KINDS}
        self.devices: dict[str, dict[str, float]] = {}  # device → {"total_j", "idle_j", "unattributed_j"}

    def add(self, split: Split, info: Callable[[ProcKey], ProcessInfo], t: float, dt_s: float) -> None:
        dev = self.devices.setdefault(split.device, {"total_j": 0.0, "idle_j": 0.0, "unattributed_j": 0.0})
        dev["total_j"] += split.energy_j
        dev["idle_j"] += split.idle_j
        dev["unattributed_j"] += split.unattributed_j
        for share in split.shares:
            record = self.processes.get(share.key)
            who = info(share.key)
            if record is None:
                record = self.processes[share.key] = ProcessRecord(who, t, t)
            record.info, record.last_seen, record.alive = who, t, True
            record.joules[split.device] = record.joules.get(split.device, 0.0) + share.total_j
            record.idle_j[split.device] = record.idle_j.get(split.device, 0.0) + share.idle_j
            record.watts[split.device] = share.total_j / dt_s if dt_s > 0 else 0.0
            if split.basis is not None and split.device != "cpu":
                record.basis[split.device] = split.basis
            for kind, name in group_names(who).items():
                group = self.groups[kind].get(name)
                if group is None:
                    group = self.groups[kind][name] = Group(first_seen=t)
                group.joules[split.device] = group.joules.get(split.device, 0.0) + share.total_j
                group.last_active = t
                if who.user:
                    group.users.add(who.user)

    def settle(self, alive: Iterable[ProcKey], t: float) -> None:
        """After an interval ending at ``t`` (s, the clock :meth:`add` is given): mark processes no longer
        running, drop old and excess records, fold excess groups into ``other``."""
        alive = set(alive)
        for key, record in list(self.processes.items()):
            if key not in alive:
                if record.alive:
                    record.alive = False
                    record.watts = {}
                if t - record.last_seen > self.keep_exited_s:
                    del self.processes[key]
        if len(self.processes) > self.max_processes:
            exited = sorted((r.total_j, k) for k, r in self.processes.items() if not r.alive)
            for _j, key in exited[:len(self.processes) - self.max_processes]:
                del self.processes[key]
        for groups in self.groups.values():
            while len(groups) > self.max_groups:
                name = min((n for n in groups if n != OTHER), key=lambda n: groups[n].last_active)
                gone = groups.pop(name)
                other = groups.setdefault(OTHER, Group(first_seen=gone.first_seen))
                for device, joules in gone.joules.items():
                    other.joules[device] = other.joules.get(device, 0.0) + joules

    def group_document(self) -> dict[str, Any]:
        return {kind: {name: {**{d: round(j, 3) for d, j in sorted(g.joules.items())},
                              "total_j": round(sum(g.joules.values()), 3), "users": sorted(g.users)}
                       for name, g in sorted(groups.items())}
                for kind, groups in self.groups.items()}
