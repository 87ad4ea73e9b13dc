"""What Prometheus gets of the accounting: bounded, monotonic counters.

Per device: total, idle, unattributed and attributed joules (present at 0 from the moment the device is
known). Per family (``unit``, ``job``, ``container``, ``process``): at most ``top_n`` consumers get series of
their own; a consumer is admitted when there is room, by the energy it used in the interval it appeared
(largest first), and keeps its series while it used energy within ``ttl_s`` (on the boot clock the energy
service gives: an NTP step of the wall clock neither keeps nor ends it); then its series ends and what it had
counted moves to the family's ``other`` series, where the energy of consumers without a series goes. So every
series only grows, and per device ``sum(family) = attributed`` at every scrape (``rate()`` sums hold). The
export is rebuilt after each accounting pass as frozen tuples: the scrape thread reads it without a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from aithermd.accounting.attribution import Split
from aithermd.accounting.ledger import OTHER, group_names
from aithermd.accounting.procs import ProcessInfo, ProcKey
from aithermd.model import GpuUsage

FAMILIES = ("unit", "job", "container", "process")


@dataclass(frozen=True, slots=True)
class EnergyExport:
    devices: tuple[tuple[str, float, float, float], ...] = ()  # (device, total, idle, unattributed) J
    gpus: tuple[tuple[str, str, int | None, int | None, int], ...] = ()  # (device, uuid, used, total B, n)
    # family → ((consumer label values...), device, J); the "other" consumer has label values ("other", ...)
    families: Mapping[str, tuple[tuple[tuple[str, ...], str, float], ...]] = field(default_factory=dict)
    uuids: Mapping[str, str] = field(default_factory=dict)  # GPU device id → its UUID (dcgm's ``UUID``)


class TopN:
    """One family's bounded counters (see the module docstring)."""

    def __init__(self, n: int = 10, ttl_s: float = 600.0) -> None:
        self.n, self.ttl_s = n, ttl_s
        self.members: dict[tuple[str, ...], float] = {}  # consumer labels → last time it used energy
        self.counters: dict[tuple[tuple[str, ...], str], float] = {}
        self.other: dict[str, float] = {}

    def add(self, t: float, increments: Mapping[tuple[str, ...], Mapping[str, float]]) -> None:
        for name, last in list(self.members.items()):
            if t - last > self.ttl_s and name not in increments:
                del self.members[name]
                for key in [k for k in self.counters if k[0] == name]:  # its joules stay in the family's sum
                    self.other[key[1]] = self.other.get(key[1], 0.0) + self.counters.pop(key)
        newcomers = sorted((n for n in increments if n not in self.members),
                           key=lambda n: -sum(increments[n].values()))
        for name in newcomers:
            if len(self.members) < self.n:
                self.members[name] = t
        for name, per in increments.items():
            if name in self.members:
                self.members[name] = t
                for device, joules in per.items():
                    self.counters[(name, device)] = self.counters.get((name, device), 0.0) + joules
            else:
                for device, joules in per.items():
                    self.other[device] = self.other.get(device, 0.0) + joules

    def rows(self, width: int) -> tuple[tuple[tuple[str, ...], str, float], ...]:
        other = (OTHER,) + ("",) * (width - 1)
        return tuple([(name, device, j) for (name, device), j in sorted(self.counters.items())]
                     + [(other, device, j) for device, j in sorted(self.other.items())])


def _labels(kind: str, info: ProcessInfo) -> tuple[str, ...] | None:
    names = group_names(info)
    if kind == "process":
        return (str(info.pid), info.comm)
    if kind == "container":
        return (names["container"], info.cgroup.pod or "") if "container" in names else None
    return (names[kind],) if kind in names else None


WIDTH = {"unit": 1, "job": 1, "container": 2, "process": 2}


class Exporter:
    def __init__(self, top_n: int = 10, ttl_s: float = 600.0) -> None:
        self.families = {kind: TopN(top_n, ttl_s) for kind in FAMILIES}
        self.export = EnergyExport()

    def update(self, t: float, splits: Iterable[Split], info: Callable[[ProcKey], ProcessInfo],
               devices: Mapping[str, Mapping[str, float]], usage: Mapping[str, GpuUsage],
               known: Iterable[str] = (), uuids: Mapping[str, str] | None = None) -> EnergyExport:
        """After a pass ending at ``t`` (boot-clock s): this interval's ``splits``, the ledger's per-device
        totals, the GPUs' usage; ``uuids``: {GPU device id: UUID} of the snapshot's devices."""
        per_kind: dict[str, dict[tuple[str, ...], dict[str, float]]] = {k: {} for k in FAMILIES}
        for split in splits:
            for share in split.shares:
                who = info(share.key)
                for kind in FAMILIES:
                    labels = _labels(kind, who)
                    if labels is not None:
                        per = per_kind[kind].setdefault(labels, {})
                        per[split.device] = per.get(split.device, 0.0) + share.total_j
        for kind, topn in self.families.items():
            topn.add(t, per_kind[kind])
        all_devices = dict.fromkeys([*known, *devices])
        self.export = EnergyExport(
            devices=tuple((d, devices.get(d, {}).get("total_j", 0.0), devices.get(d, {}).get("idle_j", 0.0),
                           devices.get(d, {}).get("unattributed_j", 0.0)) for d in all_devices),
            gpus=tuple((d, u.uuid or "", u.memory_used_bytes, u.memory_total_bytes, len(u.processes or ()))
                       for d, u in sorted(usage.items())),
            families={kind: topn.rows(WIDTH[kind]) for kind, topn in self.families.items()},
            uuids={**{d: u.uuid for d, u in usage.items() if u.uuid}, **(uuids or {})})
        return self.export
