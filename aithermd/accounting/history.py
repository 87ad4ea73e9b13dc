"""Energy history: attributed joules per day and per unit, Slurm job, container and command, kept in the
state directory (``energy-history.json``) within a size bound, and the reports read from it.

Per local day: each device's total, idle and unattributed joules, and per group kind (``unit``, ``job``,
``container``, ``process`` — a command name, pids being too short-lived to report on) the joules per device.
Per Slurm job: first and last time seen, users, joules per device (the job's own record, whatever became of
it in Slurm). Bounds: ``max_days`` days, ``max_names`` names per kind and day (the smallest beyond that fold
into ``other``), ``max_jobs`` job records (the oldest go first), and the file within 2 MiB (the oldest days
go first, :mod:`aithermd.accounting.service`). Reports: kWh, and cost where a price per kWh is set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from aithermd.accounting.attribution import Split
from aithermd.accounting.ledger import OTHER, group_names
from aithermd.accounting.procs import ProcessInfo, ProcKey
from aithermd.errors import InvalidArgument

FORMAT = "aithermd-energy-history/1"
KINDS = ("unit", "job", "container", "process")
J_PER_KWH = 3.6e6


def day_of(t_wall: float) -> str:
    """The local date of a wall-clock time, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.localtime(t_wall))


def _dicts(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, dict)}


def _add(into: dict[str, float], device: str, joules: float) -> None:
    into[device] = into.get(device, 0.0) + joules


class EnergyHistory:
    def __init__(self, data: Mapping[str, Any] | None = None, *, max_days: int = 400,
                 max_names: int = 200, max_jobs: int = 5000) -> None:
        self.max_days, self.max_names, self.max_jobs = max_days, max_names, max_jobs
        self.days: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        if data and data.get("format") == FORMAT:
            self.days = _dicts(data.get("days"))
            self.jobs = _dicts(data.get("jobs"))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "days": self.days, "jobs": self.jobs}

    def add(self, split: Split, info: Callable[[ProcKey], ProcessInfo], t_wall: float) -> None:
        day = self.days.setdefault(day_of(t_wall), {"total": {}, "idle": {}, "unattributed": {},
                                                    **{k: {} for k in KINDS}})
        _add(day["total"], split.device, split.energy_j)
        _add(day["idle"], split.device, split.idle_j)
        _add(day["unattributed"], split.device, split.unattributed_j)
        for share in split.shares:
            who = info(share.key)
            names = group_names(who)
            names["process"] = who.comm or f"pid {who.pid}"
            for kind, name in names.items():
                _add(day[kind].setdefault(name, {}), split.device, share.total_j)
            job = names.get("job")
            if job is not None:
                record = self.jobs.setdefault(job, {"first": t_wall, "last": t_wall, "users": [],
                                                    "joules": {}})
                record["last"] = t_wall
                if who.user and who.user not in record["users"]:
                    record["users"].append(who.user)
                _add(record["joules"], split.device, share.total_j)

    def drop_oldest_day(self) -> bool:
        """Forget the oldest day (the file's size bound); False when one day or none is left."""
        if len(self.days) <= 1:
            return False
        del self.days[min(self.days)]
        return True

    def trim(self) -> None:
        """Apply the bounds (see the module docstring)."""
        for old in sorted(self.days)[:-self.max_days]:
            del self.days[old]
        for day in self.days.values():
            for kind in KINDS:
                names = day.get(kind, {})
                if len(names) > self.max_names:
                    ranked = sorted((n for n in names if n != OTHER), key=lambda n: sum(names[n].values()))
                    other = names.setdefault(OTHER, {})
                    for n in ranked[:len(names) - self.max_names]:
                        for device, joules in names.pop(n).items():
                            _add(other, device, joules)
        if len(self.jobs) > self.max_jobs:
            for job in sorted(self.jobs, key=lambda j: self.jobs[j]["last"])[:len(self.jobs) - self.max_jobs]:
                del self.jobs[job]

    def report(self, since_wall: float, by: str, *, cost_per_kwh: float | None = None,
               currency: str = "") -> dict[str, Any]:
        """``{"since", "by", "rows": [{"name", "joules": {device: J}, "total_j", "kwh", "cost"?}], "total",
        "idle", "unattributed"}`` for days from ``since_wall``'s day on. The rows add up to ``total``: by
        ``day``, one row a day (``idle`` and ``unattributed`` are parts of them); by a group kind, the
        groups largest first (for ``job``: with ``first``, ``last`` and ``users``), then the rest, marked
        ``"rest": true``: ``(none)`` (charged to processes in no job or container; by ``job`` and
        ``container`` only), ``(idle)`` (the idle floor no process held) and ``(unattributed)``. ``by``:
        ``unit``, ``job``, ``container``, ``process`` or ``day``. Raises InvalidArgument for another
        ``by``."""
        if by not in (*KINDS, "day"):
            raise InvalidArgument(f"by must be one of {', '.join((*KINDS, 'day'))}, not {by!r}")
        first = day_of(since_wall)
        days = {d: v for d, v in self.days.items() if d >= first}
        rows: dict[str, dict[str, float]] = {}
        if by == "day":
            rows = {d: dict(v.get("total", {})) for d, v in days.items()}
        else:
            for v in days.values():
                for name, per in v.get(by, {}).items():
                    for device, joules in per.items():
                        _add(rows.setdefault(name, {}), device, joules)
        totals: dict[str, dict[str, float]] = {"total": {}, "idle": {}, "unattributed": {}}
        for v in days.values():
            for part, into in totals.items():
                for device, joules in v.get(part, {}).items():
                    _add(into, device, joules)

        def row(name: str, joules: Mapping[str, float], **extra: Any) -> dict[str, Any]:
            total = math.fsum(joules.values())
            out: dict[str, Any] = {"name": name,
                                   "joules": {d: round(j, 3) for d, j in sorted(joules.items())},
                                   "total_j": round(total, 3), "kwh": round(total / J_PER_KWH, 9), **extra}
            if cost_per_kwh is not None:
                out["cost"] = round(total / J_PER_KWH * cost_per_kwh, 4)
            if by == "job" and name in self.jobs:
                out.update(first=self.jobs[name]["first"], last=self.jobs[name]["last"],
                           users=self.jobs[name]["users"])
            return out

        ordered = sorted(rows.items(), key=lambda kv: (kv[0] if by == "day" else -math.fsum(kv[1].values())))
        out_rows = [row(n, j) for n, j in ordered]
        if by != "day" and days:
            out_rows += [row(n, j, rest=True) for n, j in _rest(by, rows, totals).items()]
        return {"since": since_wall, "first_day": first, "by": by, "currency": currency,
                "cost_per_kwh": cost_per_kwh, "rows": out_rows,
                **{part: row(part, into) for part, into in totals.items()}}


def _rest(by: str, rows: Mapping[str, Mapping[str, float]],
          totals: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """What no ``by`` group holds, per device: ``(none)`` (charged to processes outside every group of that
    kind: the total less idle, unattributed and the groups, never below 0), ``(idle)``, ``(unattributed)``."""
    rest: dict[str, dict[str, float]] = {}
    if by in ("job", "container"):
        rest["(none)"] = {device: max(0.0, total - totals["idle"].get(device, 0.0)
                                      - totals["unattributed"].get(device, 0.0)
                                      - math.fsum(per.get(device, 0.0) for per in rows.values()))
                          for device, total in totals["total"].items()}
    rest["(idle)"] = dict(totals["idle"])
    rest["(unattributed)"] = dict(totals["unattributed"])
    return rest
