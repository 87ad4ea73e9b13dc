"""Text for people watching a simulation: live progress lines and the final summary. Pure (dict → str).

Work is counted in seconds of full-speed training on each card (1 s at 100 % utilization with no power
cap = 1.0), so it adds up across cards of one model and compares policies on the same machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_LISTED = 40  # power-limit changes listed in the text summary


class Output:
    """Where a simulation's lines go (stdout). Once its reader is gone (``| head -1``: BrokenPipeError) it
    writes nothing more, points the stream's descriptor at /dev/null (so nothing fails again when Python
    flushes it at exit) and calls ``on_gone`` once: the runner stops the daemon, which restores and exits
    cleanly, and the simulation's temporary files are removed (exit 0, as aithermctl does)."""

    def __init__(self, out: Any, on_gone: Any = None) -> None:
        self.out, self.on_gone, self.gone = out, on_gone, False

    def write(self, text: str) -> None:
        self._do(lambda: self.out.write(text))

    def flush(self) -> None:
        self._do(self.out.flush)

    def _do(self, what: Any) -> None:
        if self.gone:
            return
        try:
            what()
        except BrokenPipeError:
            self.gone = True
            import os
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.out.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):  # not a file (a StringIO): nothing to flush later
                pass
            if self.on_gone is not None:
                self.on_gone()


def clock(t_s: float) -> str:
    """``m:ss`` (or ``h:mm:ss``) of simulated time."""
    t = int(round(t_s))
    h, rem = divmod(t, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _num(value: Any, fmt: str = "g") -> str:
    return "—" if value is None else format(value, fmt)


def actuation_line(a: Mapping[str, Any]) -> str:
    """One actuation as ``  2:05  gpu0/power_limit  450 → 600 W  ai-training/raise``; one the card did not
    take as asked: ``450 → 250 W (150 W asked)``, what it took first."""
    unit = a.get("unit") or ""
    new = _num(a.get("new")) if "took" not in a else f"{_num(a['took'])} {unit} ({_num(a.get('new'))}"
    return (f"  {clock(a['t_s']):>7}  {a['knob']:<28} {_num(a.get('old'))} → {new} "
            f"{unit}{' asked)' if 'took' in a else ''}  {a.get('rule') or ''}").rstrip()


def fault_line(t_s: float, what: str, spec: str) -> str:
    """A fault turned ``on`` or ``off`` (``--fault SPEC``), in the progress lines' form."""
    return f"[{clock(t_s):>7}] fault {what:<3}  {spec}"


def fault_lines(faults: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary's list of the faults turned on and off during the run."""
    if not faults:
        return []
    return ["", f"faults injected ({len(faults)} change{'' if len(faults) == 1 else 's'}):",
            *(f"{clock(float(f['t_s'])):>9}  {f['fault']:<3}  {f['spec']}" for f in faults)]


def faults_too_late(faults: Sequence[Any], duration_s: float | None) -> list[str]:
    """A warning for each ``--fault`` (a parsed :class:`~aithermd.sim.faults.Fault`) that starts at or after
    the end of a run of ``duration_s`` simulated seconds (None: until stopped, so none)."""
    return [f"--fault {f.spec} starts at {clock(f.start)}, after the run's {clock(duration_s)} (--duration): "
            "it never happens" for f in faults if duration_s is not None and f.start >= duration_s]


def progress_line(t_s: float, phase: str, gpus: Mapping[str, Mapping[str, Any]]) -> str:
    """A status line: time, workload phase, then per GPU limit, draw and temperature; a GPU whose ``gone``
    says why (``lost``: off the bus, ``removed``: unplugged) shows that alone, as no reading of it exists."""
    parts = [f"{name} {g['gone']}" if g.get("gone") else
             f"{name} {_num(g.get('limit_w'), '.0f')} W limit, {_num(g.get('power_w'), '.0f')} W, "
             f"{_num(g.get('temp_c'), '.0f')} °C" for name, g in gpus.items()]
    return f"[{clock(t_s):>7}] {phase:<8} | " + " | ".join(parts)


LIMIT_KNOBS = ("/power_limit", "/sm_clock_lock")


def stock_lines(data: Mapping[str, Any]) -> list[str]:
    """Work per joule and slowdown against the stock twin: the same jobs at every card's default limit."""
    if "work_per_j_gain_pct" not in data:
        return []
    per = "; ".join(f"{name} {g['work_per_j_gain_pct']:+.1f} % work/J, {g['slowdown_pct']:.1f} % slower"
                    if "lost_at_s" not in g else f"{name} lost at {clock(g['lost_at_s'])}, not scored"
                    for name, g in data.get("gpus", {}).items()
                    if "work_per_j_gain_pct" in g or "lost_at_s" in g)
    return ["", f"against stock (the same seed and jobs, every limit at its default): work per joule "
                f"{data['work_per_j_gain_pct']:+.1f} %, slowdown {data['slowdown_pct']:.1f} %",
            f"  {per}" if per else ""][:3 if per else 2]


def with_reasons(gpus: Mapping[str, Any], actuations: Sequence[Mapping[str, Any]]) -> None:
    """Each GPU's ``limit_changes`` ``[t_s, old_w, new_w]`` (what the card saw) gets a 4th element: the
    rule and reason of the daemon's actuation that wrote it (same knob, new value within 1 W, within 2 s),
    or that none did (the restore on exit, a fault)."""
    for name, g in gpus.items():
        acts = [a for a in actuations if a.get("knob") == f"{name}/power_limit"]
        for change in g.get("limit_changes", ()):
            a = next((a for a in acts if a.get("new") is not None and abs(a["new"] - change[2]) < 1.0
                      and abs(a["t_s"] - change[0]) <= 2.0), None)
            if a is not None:
                acts.remove(a)
            change.append(f"{a.get('rule')}: {a.get('reason')}" if a is not None
                          else "not a decision of the daemon's (its restore on exit, or a fault)")


def held_lines(held: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """GPUs the daemon found held high while idle, and what a clock lock took off them."""
    if not held:
        return []
    lines = ["", "held high while idle (found by the daemon):"]
    for gpu, h in held.items():
        lines.append(f"  {gpu} at {clock(h['first_s'])}: {h['held_w']:.0f} W against a floor of "
                     f"{h['floor_w']:.0f} W, held {clock(h['held_s'])}; a clock lock took "
                     f"{h['recovered_w']:.0f} W off")
    return lines


def not_put_back(data: Mapping[str, Any]) -> list[str]:
    """The GPUs whose limit after the run is not the one the first change found (a GPU lost for good
    cannot be restored), by name."""
    out = []
    for name, g in data.get("gpus", {}).items():
        changes = g.get("limit_changes") or ()
        found = changes[0][1] if changes and changes[0][1] else None
        final = g.get("final_limit_w")
        if found is not None and (final is None or abs(final - found) > 0.05):
            out.append(name)
    return out


def lasting_faults(data: Mapping[str, Any]) -> dict[str, float]:
    """The faults of a run's log (``data["faults"]``) that were on at its end: spec → when it came on (s)."""
    on: dict[str, float] = {}
    for f in data.get("faults", ()):
        if f["fault"] == "on":
            on[f["spec"]] = f["t_s"]
        else:
            on.pop(f["spec"], None)
    return on


def leave_out_lost(data: dict[str, Any]) -> None:
    """A GPU lost until the run's end (``gpuN:GPU_IS_LOST`` or ``gpuN:ABSENT`` still on) is left out of the
    score: the simulated card runs on at its last limit, which no daemon on a real machine could have kept
    and no job on a card off the bus would use. Its entry gets ``lost_at_s`` in place of its gain and
    slowdown, and the run's gain and slowdown are worked out again over the other GPUs (their own totals)."""
    from aithermd.sim.faults import parse

    lost: dict[str, float] = {}
    for spec_text, t_s in lasting_faults(data).items():
        spec = parse(spec_text)
        if spec.target == "gpu" and not spec.function and (
                spec.kind == "absent" or (spec.kind == "code" and int(spec.value) == 15)):
            lost.setdefault(f"gpu{spec.gpu}", t_s)
    gpus = data.get("gpus", {})
    for name, t_s in lost.items():
        if name in gpus:
            g = gpus[name]
            g.pop("work_per_j_gain_pct", None)
            g.pop("slowdown_pct", None)
            g["lost_at_s"] = t_s
    if not any(name in gpus for name in lost) or "work_per_j_gain_pct" not in data:
        return
    kept = [g for g in gpus.values() if "lost_at_s" not in g]
    work, energy = sum(g["work"] for g in kept), sum(g["energy_j"] for g in kept)
    stock_work, stock_energy = sum(g["stock_work"] for g in kept), sum(g["stock_energy_j"] for g in kept)
    wpk = work / energy if energy else 0.0
    stock_wpk = stock_work / stock_energy if stock_energy else 0.0
    data["work_per_j_gain_pct"] = round(100.0 * (wpk / stock_wpk - 1.0), 2) if stock_wpk else 0.0
    data["slowdown_pct"] = round(100.0 * (1.0 - work / stock_work), 2) if stock_work > 0 else 0.0
    data["scored_gpus"] = [name for name, g in gpus.items() if "lost_at_s" not in g]


def exit_reason(data: Mapping[str, Any]) -> str:
    """Why a simulation's daemon exited non-zero, for its one stderr line: the knobs its restore could not
    put back (an injected fault that lasts to the end loses a GPU for good, and a real daemon exits 1 when
    a knob stays changed), or "" when that was not the reason."""
    failed = data.get("not_restored") or {}
    if not failed:
        return ""
    lasting = list(lasting_faults(data))
    whys = sorted({why.rsplit(": ", 1)[-1] for why in failed.values()})  # "gpu1 is lost (NVML_ERROR_...)"
    cause = f" (the fault {', '.join(lasting)} lasts to the end of the run)" if lasting else ""
    return f": {', '.join(sorted(failed))} could not be put back: {'; '.join(whys)}{cause}"


def _no_op(actuation: Mapping[str, Any]) -> bool:
    """An actuation that left its knob where it was (``450 → 450 W``, or a cut the card did not take): not a
    change."""
    old, new = actuation.get("old"), actuation.get("took", actuation.get("new"))
    return isinstance(old, int | float) and isinstance(new, int | float) and abs(new - old) < 0.05


def format_summary(data: Mapping[str, Any]) -> str:
    """The summary of one run (the dict of :func:`aithermd.sim.runner.print_summary`) as text."""
    lines = [f"aithermd simulation summary — policy {data.get('policy')}, "
             f"{clock(data['duration_s'])} simulated",
             "workload: " + ", ".join(f"{k} {clock(v)}" for k, v in data.get("phase_s", {}).items()), ""]
    lines.append(f"{'':6}{'model':<32}{'energy kJ':>10}{'work':>9}{'work/kJ':>9}{'peak °C':>9}"
                 f"{'throttle °C':>13}{'W after exit (default/max)':>28}{'changes':>9}")
    dry = bool(data.get("dry_run"))
    actuations = [a for a in data.get("actuations", ()) if not _no_op(a)]
    changes = [a for a in actuations if str(a.get("knob", "")).endswith(LIMIT_KNOBS)
               or "/pl" in str(a.get("knob", ""))]
    for name, g in data.get("gpus", {}).items():
        limits = (f"{_num(g.get('final_limit_w'))} "
                  f"({_num(g.get('default_limit_w'))}/{_num(g.get('max_limit_w'))})")
        lines.append(f"{name:<6}{g['name'][:31]:<32}{g['energy_j'] / 1000:>10.1f}{g['work']:>9.1f}"
                     f"{g['work_per_kj']:>9.3f}{g['peak_temp_c']:>9.1f}{_num(g.get('slowdown_temp_c')):>13}"
                     f"{limits:>28}{sum(str(a['knob']).startswith(name + '/') for a in changes):>9}")
    lines.append(f"{'GPUs':<38}{data['gpu_energy_j'] / 1000:>10.1f}{data['work']:>9.1f}"
                 f"{data['work_per_kj']:>9.3f}")
    lines.append(f"{'CPU package (RAPL)':<38}{data['cpu_energy_j'] / 1000:>10.1f}{'':>18}"
                 f"{data['peak_cpu_c']:>9.1f}")
    lines.append(f"{'case air':<38}{'':>10}{'':>18}{data['peak_case_c']:>9.1f}")
    left = sorted({f"{g}/power_limit" for g in not_put_back(data)} | set(data.get("not_restored", {})))
    lines.append(f"energy {data['energy_j'] / 1000:.1f} kJ in all; work = seconds of full-speed training; "
                 + ("a dry run: the daemon wrote nothing, so it had nothing to put back" if dry else
                    f"on exit {', '.join(left)} could not be put back" if left else
                    "on exit the daemon put every knob back"))
    lines.append("changes: each GPU's power-limit and clock changes" + (" the daemon decided, none of them "
                 "written (dry run)" if dry else "") + ", listed below")
    lines += stock_lines(data)
    lines += ["", f"power-limit and clock changes ({len(changes)}){' decided, not written' if dry else ''}, "
                  "each with its reason:"]
    for a in changes[:MAX_LISTED]:
        lines.append(actuation_line(a))
        if a.get("reason"):
            lines.append(f"{'':11}{a['reason']}")
    if not changes:
        lines.append("  none")
    if len(changes) > MAX_LISTED:
        lines.append(f"  … and {len(changes) - MAX_LISTED} more (--summary-json lists every one)")
    lines += held_lines(data.get("held_idle") or {})
    lines += fault_lines(data.get("faults") or ())
    states = data.get("policy_states_s") or {}
    if states:
        lines += ["", "time per policy state:"]
        for key, per in states.items():
            lines.append(f"  {key}: " + ", ".join(f"{s} {clock(v)}" for s, v in per.items()))
    if data.get("budget"):
        from aithermd.sim.budget_watch import summary_lines
        lines += summary_lines(data["budget"])
    fans = [a for a in actuations if a not in changes]
    lines += ["", f"fan and other knob changes{' decided, not written' if dry else ''}: {len(fans)} "
              f"(board pwm changes seen by the machine: {data.get('fan_changes', 0)})"]
    return "\n".join(lines) + "\n"
