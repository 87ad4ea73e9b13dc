"""Views of the daemon's process document (``GetProcesses``, also under ``"processes"`` in ``GetSnapshot``)
and of its energy report (``GetEnergyReport``), for people: per GPU its processes, memory and how energy is
shared; energy per unit, job, container or command. Pure functions, shared by the CLI and the TUI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from aithermctl.document import Doc, fmt

SORT_KEYS = ("watts", "joules", "memory", "sm", "pid", "user", "command")
J_PER_KWH = 3.6e6


class ProcessRow(NamedTuple):
    pid: int
    user: str
    command: str
    memory_bytes: int | None
    sm_pct: float | None
    watts: float
    joules: float
    group: str  # Slurm job, else container, else systemd unit

    def key(self, by: str) -> Any:
        return {"watts": -self.watts, "joules": -self.joules, "memory": -(self.memory_bytes or 0),
                "sm": -(self.sm_pct or 0.0), "pid": self.pid, "user": self.user,
                "command": self.command}[by]


class GpuProcesses(NamedTuple):
    id: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    basis: str | None
    rows: tuple[ProcessRow, ...]
    note: str  # why the list or the utilization is missing, "" when both are there


def processes_of(doc: Doc) -> Mapping[str, Any] | None:
    """The process document inside a ``GetSnapshot`` document, or a ``GetProcesses`` one itself; None when
    the daemon accounts no energy per process."""
    proc = doc.get("processes") if "gpus" not in doc else doc
    return proc if isinstance(proc, Mapping) and proc.get("enabled") else None


def gpu_processes(proc: Mapping[str, Any], sort: str = "watts") -> list[GpuProcesses]:
    out = []
    for gpu_id, g in sorted((proc.get("gpus") or {}).items(), key=lambda kv: _natural(kv[0])):
        rows = []
        for p in g.get("processes") or ():
            group = p.get("job") or p.get("container") or p.get("unit") or ""
            rows.append(ProcessRow(int(p.get("pid", 0)), str(p.get("user") or ""),
                                   str(p.get("command") or p.get("comm") or ""), p.get("memory_bytes"),
                                   p.get("sm_pct"), float(p.get("watts") or 0.0),
                                   float(p.get("joules") or 0.0), "" if group == "-" else str(group)))
        rows.sort(key=lambda r: (r.key(sort), r.pid))
        notes = [x for x in (g.get("processes_error"), g.get("utilization_error") and
                             f"no per-process utilization ({g['utilization_error']}): shared by memory") if x]
        out.append(GpuProcesses(gpu_id, g.get("memory_used_bytes"), g.get("memory_total_bytes"),
                                g.get("basis"), tuple(rows), "; ".join(str(n) for n in notes)))
    return out


def _natural(name: str) -> tuple[str, int]:
    """``gpu10`` after ``gpu9``."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    return (stem, int(digits) if digits else -1)


def gib(b: int | None) -> str:
    return "—" if b is None else f"{b / (1 << 30):.1f}"


def memory_text(g: GpuProcesses) -> str:
    return f"{gib(g.memory_used_bytes)} / {gib(g.memory_total_bytes)} GiB"


def process_lines(proc: Mapping[str, Any], width: int = 60) -> list[str]:
    """Text lines for ``aithermctl status``: per GPU memory and processes, then energy per job and unit."""
    lines: list[str] = []
    for g in gpu_processes(proc):
        shared = f", energy shared by {g.basis}" if g.basis and g.rows else ""
        lines.append(f"  {g.id:<5} memory {memory_text(g)}, {len(g.rows)} process"
                     f"{'' if len(g.rows) == 1 else 'es'}{shared}" + (f"  ! {g.note}" if g.note else ""))
        for r in g.rows:
            lines.append(f"        {r.pid:>7} {r.user[:10]:<10} {fmt(r.sm_pct, '%'):>4} "
                         f"{gib(r.memory_bytes):>5} GiB {r.watts:7.1f} W {r.joules / 1000:9.1f} kJ  "
                         f"{(r.group + ' ') if r.group else ''}{r.command[:width]}")
    groups = proc.get("groups") or {}
    for kind, title in (("job", "Slurm jobs"), ("container", "containers"), ("unit", "units")):
        entries = sorted(((n, g) for n, g in (groups.get(kind) or {}).items() if n != "-"),
                         key=lambda ng: -float(ng[1].get("total_j") or 0.0))[:5]
        if entries:
            lines.append(f"  energy by {title} (top {len(entries)}):")
            name_w = max(28, *(len(n) for n, _ in entries))  # a long unit name widens the column, not one row
            for name, g in entries:
                parts = " ".join(f"{d}={float(j) / 1000:.1f}kJ" for d, j in sorted(g.items())
                                 if d not in ("total_j", "users"))
                kwh = float(g.get("total_j") or 0) / J_PER_KWH
                lines.append(f"        {name:<{name_w}} {kwh:9.4f} kWh  {parts}")
    return lines


_REST_NOTES = {"(none)": "charged to processes in no {by}", "(idle)": "the idle floor no process held",
               "(unattributed)": "what no process could be charged with"}


def report_text(report: Mapping[str, Any]) -> str:
    """``aithermctl energy report``: one row per unit, job, container, command or day, then the rest
    (``(none)``, ``(idle)``, ``(unattributed)``) so that the rows add up to the total line; by day, the idle
    and unattributed parts of the total under it. kWh and cost."""
    by = str(report.get("by") or "")
    currency = str(report.get("currency") or "")
    has_cost = report.get("cost_per_kwh") is not None
    rows: Sequence[Mapping[str, Any]] = report.get("rows") or ()
    head = f"energy by {by} since {report.get('first_day')}"
    if has_cost:
        head += f" (at {report['cost_per_kwh']:g} {currency}/kWh)".replace("  ", " ")
    lines = [head]
    if not rows:
        return "\n".join([*lines, "  (nothing recorded yet)"]) + "\n"
    devices = sorted({d for r in rows for d in (r.get("joules") or {})})
    name_w = max([len(str(r.get("name"))) for r in rows] + [len(by), len("  (unattributed)")])
    lines.append(f"  {by:<{name_w}} {'kWh':>10}" + (f" {'cost':>9}" if has_cost else "")
                 + "".join(f" {d:>10}" for d in devices))

    def row(r: Mapping[str, Any], name: str | None = None) -> str:
        joules = r.get("joules") or {}
        text = f"  {name or str(r.get('name')):<{name_w}} {float(r.get('kwh') or 0.0):10.4f}"
        if has_cost:
            text += f" {float(r.get('cost') or 0.0):9.2f}"
        return text + "".join(f" {float(joules.get(d, 0.0)) / J_PER_KWH:10.4f}" for d in devices)

    lines += [row(r) for r in rows]
    if isinstance(report.get("total"), Mapping):
        lines.append("  " + "-" * (len(lines[-1]) - 2))
        lines.append(row(report["total"], "total"))
    if by == "day":
        parts = [(p, report[p]) for p in ("idle", "unattributed") if isinstance(report.get(p), Mapping)]
        if parts:
            lines.append("  of which")
            lines += [row(part, f"  ({name})") for name, part in parts]
    named = ([str(r.get("name")) for r in rows if r.get("rest")] if by != "day"
             else ["(idle)", "(unattributed)"])
    lines += [f"  {name}: {_REST_NOTES[name].format(by=by)}" for name in dict.fromkeys(named)
              if name in _REST_NOTES]
    return "\n".join(lines) + "\n"
