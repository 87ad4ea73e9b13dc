"""Plain-text output of the CLI verbs: status, explain, policies, holds, energy. Documents in, text out."""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aithermctl.document import Doc, all_knobs, effective_policy, fmt, overview
from aithermctl.durations import format_duration
from aithermctl.processes import process_lines, processes_of

LAYERS = {
    "safety": "a safety rule",
    "override": "an operator override",
    "hold": "a held policy",
    "policy": "the active policy",
    "default": "no rule (the value found at start is kept)",
}


def _limit_text(cur: float | None, lo: float | None, hi: float | None, default: float | None) -> str:
    bounds = f"{fmt(lo)}–{fmt(hi)} W" if lo is not None or hi is not None else ""
    extra = ", ".join(x for x in (bounds, f"default {fmt(default, 'W')}" if default is not None else "") if x)
    return f"limit {fmt(cur, 'W')}" + (f" ({extra})" if extra else "")


def _daemon_now(doc: Doc) -> float:
    """The daemon's wall clock at the snapshot (``t_wall``), else ours."""
    t = doc.get("t_wall")
    return float(t) if isinstance(t, int | float) else time.time()


def owner_text(hold: Mapping[str, Any]) -> str:
    """A hold's owner for people: ``"alice: python3 (pid 4242)"`` when the client resolved it
    (``owner_text``), else the bus name (``:1.42``)."""
    return str(hold.get("owner_text") or hold.get("owner") or "?")


def hold_ends(hold: Mapping[str, Any], now: float) -> str:
    """When a hold ends, for the policy screen: the time left on its timeout (``"4m 10s"``); with no timeout,
    ``"until released"`` (detached) or ``"until owner quits"`` (it also ends when its owner leaves the bus)."""
    expires = hold.get("expires")
    if isinstance(expires, int | float):
        return format_duration(max(0.0, expires - now))
    return "until released" if hold.get("detached") else "until owner quits"


def holds_lines(holds: Sequence[Mapping[str, Any]], now: float | None = None) -> list[str]:
    """One line per hold: cookie, policy, reason, owner, expiry."""
    now = time.time() if now is None else now
    lines = []
    for h in holds:
        expires = h.get("expires")
        left = ""
        if isinstance(expires, int | float):
            left = f", {format_duration(max(0.0, expires - now))} left"
        kind = "detached" if h.get("detached") else f"until {owner_text(h)} leaves"
        lines.append(f"  cookie {h.get('cookie')}: {h.get('policy')} — {h.get('reason') or 'no reason'} "
                     f"({kind}{left})")
    return lines


def status_text(doc: Doc, now: float | None = None) -> str:
    """The ``aithermctl status`` summary: policy, GPUs, CPU packages, fans, alarms, problems."""
    ov = overview(doc)
    policy = doc.get("policy") or {}
    effective = effective_policy(policy)
    head = f"policy {ov.active_policy or '—'}"
    if effective != ov.active_policy:
        head += f" (held: {effective} in force)"
    if ov.dry_run:
        head += " · dry run: nothing is written"
    lines = [head]
    # expiries are on the daemon's clock: measure them from the snapshot's own time (a simulated daemon's
    # wall clock runs faster than ours)
    lines += holds_lines(ov.holds, now if now is not None else _daemon_now(doc))
    for scope_policy, states in ov.states.items():
        shown = ", ".join(f"{scope} {state}" for scope, state in states.items())
        if shown:
            lines.append(f"  {scope_policy}: {shown}")
    if doc.get("budget"):
        lines += budget_lines(doc["budget"])
    if ov.gpus:
        lines.append("")
        lines.append("GPUs")
    for g in ov.gpus:
        fans = " ".join(fmt(f.pct, "%") for f in g.fans) or "—"
        lines.append(f"  {g.id:<5} {g.name}")
        lines.append(f"        {fmt(g.temp_c, '°C'):>6}  power {fmt(g.power_w, 'W', 1)} of "
                     f"{_limit_text(g.limit_w, g.limit_min_w, g.limit_max_w, g.default_w)}  "
                     f"util {fmt(g.util_pct, '%')}  fans {fans}")
        by = f"{g.rule}: {g.reason}" if g.rule else (g.reason or "no rule (the value found at start)")
        lines.append(f"        limit set by {by}")
        if g.reasons:
            lines.append(f"        clock events: {', '.join(g.reasons)}")
        if g.held_idle:
            lines.append(f"        {held_idle_text(g.held_idle, holders(doc, g.id))}")
        for p in g.problems:
            lines.append(f"        ! {p}")
    proc = processes_of(doc)
    if proc is not None:
        lines.append("")
        lines.append("Processes (pid, user, SM, GPU memory, W, energy so far, job/unit, command)")
        lines += process_lines(proc)
    if ov.packages:
        lines.append("")
        lines.append("CPU packages")
    for p in ov.packages:
        lines.append(f"  {p.name:<10} power {fmt(p.power_w, 'W', 1):>8}  PL1 {fmt(p.pl1_w, 'W')}  "
                     f"PL2 {fmt(p.pl2_w, 'W')}  {fmt(p.temp_c, '°C')}" + (f"  ({p.rule})" if p.rule else ""))
    if ov.fans:
        lines.append("")
        lines.append("Fans")
        width = max(len(f.label) for f in ov.fans)
        for f in ov.fans:
            bad = "" if f.status == "ok" else f"  ! {f.status}"
            cal = f"  starts {fmt(f.start_pct, '%')}, stops {fmt(f.stop_pct, '%')}" \
                if f.start_pct is not None and f.stop_pct is not None else ""
            lines.append(f"  {f.label:<{width}} {fmt(f.rpm, 'RPM'):>9}  duty {fmt(f.duty_pct, '%'):>4}  "
                         f"{f.source}{cal}{bad}")
    alarms = doc.get("alarms") or {}
    if alarms:
        lines.append("")
        lines.append("Alarms")
        for subject, a in alarms.items():
            lines.append(f"  ! {a.get('kind')}: {a.get('message') or subject}")
    if ov.degraded:
        lines.append("")
        lines.append("Degraded: " + ", ".join(ov.degraded))
    return "\n".join(lines) + "\n"


def budget_lines(budget: Mapping[str, Any]) -> list[str]:
    """The node power budget in force (the document's ``budget``): what it is, how it was worked out, what
    the devices draw and were allotted, the wall draw that implies, and a budget that cannot hold."""
    how = f" ({budget['how']})" if budget.get("how") else ""
    total = fmt(budget.get("budget_w"), "W")
    drawn, allotted = fmt(budget.get("drawn_w"), "W", 1), fmt(budget.get("allotted_w"), "W", 1)
    lines = ["", f"power budget ({budget.get('policy') or '—'}): {total} for the GPUs and CPU packages{how}",
             f"  drawn {drawn}, allotted {allotted}"]
    if budget.get("wall_w") is not None and budget.get("wall_drawn_w") is not None:
        lines[-1] += f"; at the wall ≈ {fmt(budget['wall_drawn_w'], 'W')} of {fmt(budget['wall_w'], 'W')}"
    if budget.get("short_w"):
        lines.append(f"  ! {fmt(budget['short_w'], 'W')} below the lowest limits of its devices: each is "
                     "held at its minimum, and it cannot hold")
    return lines


def held_idle_text(h: Mapping[str, Any], by: Sequence[str] = ()) -> str:
    """A GPU held high while idle: ``held high while idle for 2m 05s (P0): 68 W against a floor of 27 W
    (learned), 41 W over; a clock lock took 12 W off; held by pid 4110 (bob: python -m ipykernel_launcher)``
    (``by``: :func:`holders`)."""
    pstate = h.get("pstate")
    pstate = None if pstate is None else str(pstate) if str(pstate).upper().startswith("P") else f"P{pstate}"
    text = (f"held high while idle for {format_duration(float(h.get('for_s') or 0.0))}"
            + (f" ({pstate})" if pstate else "")
            + f": {fmt(h.get('power_w'), 'W')} against a floor of {fmt(h.get('floor_w'), 'W')}"
            + f" ({h.get('floor') or 'assumed'}), {fmt(h.get('excess_w'), 'W')} over")
    if (h.get("recovered_w") or 0.0) > 0.5:
        text += f"; a clock lock took {fmt(h.get('recovered_w'), 'W')} off"
    if by:
        text += "; held by " + ", ".join(by)
    return text


def holders(doc: Doc, gpu: str) -> list[str]:
    """The processes NVML lists on ``gpu`` (the snapshot's process document), for people: ``pid 4110 (bob:
    python -m ipykernel_launcher)``; empty when the daemon accounts no processes."""
    proc = processes_of(doc)
    g = ((proc or {}).get("gpus") or {}).get(gpu) or {}
    return [f"pid {p.get('pid')} ({p.get('user') or '?'}: {p.get('command') or p.get('comm') or '?'})"
            for p in g.get("processes") or ()]


def _inputs_text(inputs: Mapping[str, Any]) -> str:
    parts = []
    for name, v in inputs.items():
        if isinstance(v, Mapping) and isinstance(v.get("elapsed_s"), int | float) \
                and isinstance(v.get("need_s"), int | float):  # a window, dwell or timer, as the engine says
            parts.append(f"{name}: {format_duration(v['elapsed_s'])} of {format_duration(v['need_s'])}")
        elif isinstance(v, Mapping):
            inner = ", ".join(f"{k} {_num(x)}" for k, x in v.items())
            parts.append(f"{name} ({inner})")
        elif name.startswith("used:") and isinstance(v, str):  # the channels a curve used, comma-joined
            parts.append(f"{name} {v.replace(',', ', ')}")
        else:
            parts.append(f"{name} {_num(v)}")
    return "; ".join(parts)


def _num(v: Any) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def explain_paragraph(knob_id: str, entry: Mapping[str, Any], knob: Mapping[str, Any] | None) -> str:
    """One readable paragraph: the value, who set it and why, the inputs, the knob's limits."""
    unit = (knob or {}).get("unit") or ""
    value, requested = entry.get("value"), entry.get("requested")
    v = fmt(value, unit, 1 if isinstance(value, float) and value % 1 else 0)
    layer = str(entry.get("layer") or "")
    rule = str(entry.get("rule") or "")
    label = entry.get("label") or (knob or {}).get("label")
    words = [f"{knob_id}{f' ({label})' if label else ''} is {v}"]
    if layer == "default" or (not rule and not layer):
        words.append(f", set by {LAYERS['default']}")
    else:
        words.append(f", set by {LAYERS.get(layer, layer or 'a rule')}" + (f" ({rule})" if rule else ""))
    if entry.get("reason"):
        words.append(f": {entry['reason']}")
    text = "".join(words).rstrip(".") + "."
    numbers = isinstance(requested, int | float) and isinstance(value, int | float)
    if numbers and abs(requested - value) > 0.05:
        text += f" It asked for {fmt(requested, unit, 1)}, clamped to the knob's limits."
    if entry.get("inputs"):
        text += f" Inputs: {_inputs_text(entry['inputs'])}."
    for alarm in (entry.get("alarms") or {}).values():
        text += f" ALARM ({alarm.get('kind')}): {alarm.get('message')}"
        text += "" if str(alarm.get("message", "")).endswith(".") else "."
    if knob:
        lo, hi, default = knob.get("min"), knob.get("max"), knob.get("default")
        if lo is not None and hi is not None:
            text += f" Range {fmt(lo, unit)} to {fmt(hi, unit)}"
        elif hi is not None:
            text += f" Range up to {fmt(hi, unit)}"
        elif lo is not None:
            text += f" Range from {fmt(lo, unit)}"
        if lo is not None or hi is not None:
            text += f", default {fmt(default, unit)}." if default is not None else "."
        if not knob.get("writable", True):
            text += f" Read-only here: {knob.get('why_not') or 'no reason given'}."
    # a number keeps its unit on its line ("77 %", "-7.2 %/J", "450 W"): the space between is not a break
    text = _NUMBER_UNIT.sub("\u00a0", text)
    return textwrap.fill(text, width=100, subsequent_indent="  ", break_on_hyphens=False,
                         break_long_words=False).replace("\u00a0", " ")


_NUMBER_UNIT = re.compile(r"(?<=\d) (?=(?:%|°C|W|J|s|RPM|MHz|V|A)(?![\w]))")
NO_DECISION: Mapping[str, Any] = {"layer": "default", "rule": "", "reason": "", "inputs": {}}


def explain_text(explained: Mapping[str, Mapping[str, Any]], doc: Doc | None, only: str = "") -> str:
    """A paragraph per knob: ``only`` that one, else every knob of ``doc`` (a knob no decision touched
    reads as "no rule") and any the daemon explained that ``doc`` lacks."""
    knobs = all_knobs(doc or {})
    if only:
        ids = [only]
    else:
        ids = [*knobs, *(k for k in explained if k not in knobs)]

    def entry(knob_id: str) -> Mapping[str, Any]:
        if knob_id in explained:
            return explained[knob_id]
        return {**NO_DECISION, "value": (knobs.get(knob_id) or {}).get("value")}

    return "\n\n".join(explain_paragraph(k, entry(k), knobs.get(k)) for k in ids) + "\n"


def policies_text(policies: Sequence[Mapping[str, Any]]) -> str:
    width = max((len(str(p.get("name"))) for p in policies), default=4)
    lines = [f"{'*' if p.get('active') else ' '} {p.get('name')!s:<{width}}  {p.get('description') or ''}"
             for p in policies]
    return "\n".join(lines) + "\n"


def policy_text(policy: Mapping[str, Any]) -> str:
    head = f"# {policy.get('name')} — {policy.get('path')}\n"
    if policy.get("description"):
        head += f"# {policy['description']}\n"
    source = str(policy.get("source") or "")
    return head + source + ("" if source.endswith("\n") else "\n")


def energy_text(result: Mapping[str, Any], command: str) -> str:
    """Joules per GPU and zone, the duration, mean power; estimated joules (a pre-Volta GPU's, integrated
    from power) are marked, and the total counts each device once (the daemon's ``total_j``)."""
    duration = float(result.get("duration_s") or 0.0)
    joules: Mapping[str, float] = result.get("joules") or {}
    estimated = set(result.get("estimated") or ())
    lines = [f"energy while {command} ran, {format_duration(duration)} ({duration:.3f} s):"
             if not result.get("timed_out") else
             f"energy in the first {format_duration(duration)} ({duration:.3f} s) of {command}, when the "
             "window timed out:"]
    if not joules:  # the window closed before the daemon's first energy sample in it (every tick)
        lines.append("  nothing measured: it ended before the daemon's next energy sample (one per tick); "
                     "time a longer command, or see aithermctl energy report")
        return "\n".join(lines) + "\n"
    width = max((len(k) for k in joules), default=4)
    gpu_total = 0.0
    for dev, j in joules.items():
        mean = f"{j / duration:10.1f} W mean" if duration > 0 else ""
        lines.append(f"  {dev:<{width}} {j:12.1f} J {mean}" + ("  (estimated)" if dev in estimated else ""))
        if dev.startswith("gpu"):
            gpu_total += j
    if sum(1 for k in joules if k.startswith("gpu")) > 1:
        mean = f"{gpu_total / duration:10.1f} W mean" if duration > 0 else ""
        lines.append(f"  {'all GPUs':<{width}} {gpu_total:12.1f} J {mean}")
    total = result.get("total_j")
    if isinstance(total, int | float) and len(joules) > 1:
        mean = f"{total / duration:10.1f} W mean" if duration > 0 else ""
        lines.append(f"  {'total':<{width}} {total:12.1f} J {mean}  (each package once, without subzones "
                     "or psys)")
    own: Mapping[str, float] = result.get("attributed") or {}
    if "scope" in result:
        lines.append("its own share (by its processes' GPU utilization and CPU time):")
        for dev, j in sorted(own.items()):
            lines.append(f"  {dev:<{width}} {j:12.1f} J")
        if not own:
            lines.append("  none measured (the daemon accounts per process every few seconds)")
    return "\n".join(lines) + "\n"
