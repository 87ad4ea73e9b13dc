"""``aithermd replay --trace FILE --policy NAME|FILE [--gpu-profile DUMP] [--json]``: the real engine over a
recorded ``nvidia-smi --query-gpu=... --format=csv`` trace.

GPU limits and thresholds come from ``--gpu-profile`` (an ``nvidia-smi -q`` dump, text or XML: trace GPU i
takes the dump's GPU i, or GPU 0 when the dump has fewer), else from the shipped profile matching the
trace's ``name`` column. Output: a timeline (time, device, old → new, rule) and a summary; with ``--json``
exactly one JSON document on stdout (:func:`aithermd.policy.replay.replay`).

Exit status: 0 success; 1 malformed trace (with its line number) or invalid policy; 2 usage error,
unreadable file, unknown policy, or a GPU with no profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from aithermd import log
from aithermd.files import nonempty_arg

HELP = "run the policy engine over a recorded nvidia-smi trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, type=nonempty_arg, metavar="FILE",
                        help="nvidia-smi --query-gpu CSV log")
    parser.add_argument("--policy", required=True, type=nonempty_arg, metavar="NAME|FILE",
                        help="a policy name or a policy file")
    parser.add_argument("--gpu-profile", metavar="DUMP", help="nvidia-smi -q dump (text or XML) for limits")
    parser.add_argument("--policy-dir", action="append", type=nonempty_arg, metavar="DIR", default=None,
                        help="where to look names up (default: shipped, then /etc/aithermd/policies.d)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _err(msg: str) -> None:
    print(f"aithermd replay: {msg}", file=sys.stderr)


def _profiles(args: argparse.Namespace, trace: Any) -> list[Any] | str:
    """One profile per trace GPU, or an error message (exit 2)."""
    if args.gpu_profile:
        from aithermd.sim.smi_dump import DumpError, load_dump
        try:
            dump = load_dump(args.gpu_profile)
        except OSError as exc:
            return f"{args.gpu_profile}: cannot read: {exc.strerror or exc}"
        except DumpError as exc:  # already PATH[:LINE]: error: what is wrong (cannot read, no GPU, bad XML)
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a parse failure load_dump did not name
            return f"{args.gpu_profile}: not an nvidia-smi -q dump: {exc}"
        if not dump:
            return f"{args.gpu_profile}: no GPU in this dump"
        return [dump[i] if i < len(dump) else dump[0] for i in range(len(trace.gpu_ids))]
    from aithermd.sim.profiles import find_profile
    out = []
    for i, name in enumerate(trace.names):
        if not name:
            return (f"trace GPU {i} has no 'name' column to find its limits by: give --gpu-profile "
                    "(an nvidia-smi -q dump of that GPU)")
        prof = find_profile(name)
        if prof is None:
            return f"no shipped GPU profile matches '{name}' (trace GPU {i}): give --gpu-profile DUMP"
        out.append(prof)
    return out


FAN_STEP_SHOWN_PCT = 5.0  # a fan row is printed when its duty moved this much from the last one printed (or its
# rule changed); its "old" is the last printed row's "new", so the rows read as one chain (--json: every step)


def _watts(v: float | None) -> str:
    return "—" if v is None else f"{v:g} W"


def print_text(doc: dict[str, Any], policy: str, trace_path: str, names: list[str]) -> None:
    out = sys.stdout
    out.write(f"policy {policy} over {trace_path}: {len(doc['summary']['gpus'])} GPU(s), "
              f"{doc['summary']['duration_s']:.0f} s\n\n")
    out.write(f"{'t (s)':>9}  {'device':<7} {'knob':<12} {'old → new':<21} rule\n")
    shown: dict[str, tuple[float | None, str]] = {}  # fan knob → (duty, rule) as last printed
    hidden = 0
    for d in doc["decisions"]:
        if d["knob"] != "power_limit":  # a fan curve moves a little every sample: print the steps that count
            key = f"{d['device']}/{d['knob']}"
            last, rule = shown.get(key, (None, ""))
            if (last is not None and d["new"] is not None and abs(d["new"] - last) < FAN_STEP_SHOWN_PCT
                    and rule == d["rule"]):
                hidden += 1
                continue
            shown[key] = (d["new"], d["rule"])
            if last is not None:  # rows chain: "old" is the duty the last row shown left
                d = {**d, "old": last}
        unit = (_watts(d["old"]), _watts(d["new"])) if d["knob"] == "power_limit" else \
            (f"{round(d['old'], 1):g} %" if d["old"] is not None else "—", f"{round(d['new'], 1):g} %")
        out.write(f"{d['t']:>9.1f}  {d['device']:<7} {d['knob']:<12} {unit[0] + ' → ' + unit[1]:<21} "
                  f"{d['rule']}\n")
        why = d.get("reason") or ""
        if d["rule"].startswith("safety/"):  # what overrode the policy: a missing column, a hot trace
            out.write(f"{'':>11}{why}\n")
        elif "efficient limit" in why:  # the search's steps say why they moved
            out.write(f"{'':>11}{why.split(': ', 1)[-1]}\n")
    if not doc["decisions"]:
        out.write("        (no change)\n")
    if hidden:
        out.write(f"        ({hidden} fan change(s) of less than {FAN_STEP_SHOWN_PCT:g} % from the last shown, "
                  "by the same rule, not shown: --json lists every one)\n")
    out.write("\nsummary\n")
    for (gpu, s), name in zip(doc["summary"]["gpus"].items(), names, strict=False):
        states = ", ".join(f"{k} {v:.0f} s" for k, v in s["time_in_state_s"].items()) or "—"
        mean = "—" if s["mean_power_limit_w"] is None else f"{s['mean_power_limit_w']:.1f} W"
        out.write(f"  {gpu} {name}: {s['limit_changes']} limit change(s)"
                  f"{' (searched)' if s.get('searched') else ''}; "
                  f"energy {s['energy_j'] / 1000:.1f} kJ; "
                  f"mean limit {mean}; above the limit {s['energy_above_limit_j']:.0f} J; "
                  f"stale {s['stale_s']:.0f} s; states: {states}\n")
    if doc["summary"].get("no_search"):
        out.write(f"  no efficient search: {doc['summary']['no_search']}\n")


def run(args: argparse.Namespace) -> int:
    log.setup(level="error")
    from aithermd.errors import PolicyErrors
    from aithermd.policy.loader import ADMIN_POLICY_DIR, resolve_policy, shipped_policy_dir
    from aithermd.policy.replay import replay
    from aithermd.policy.trace import TraceError, parse_trace, read_trace_text, span_text

    try:
        text = read_trace_text(args.trace)
    except OSError as exc:
        _err(f"{args.trace}: cannot read: {exc.strerror or exc}")
        return 2
    except TraceError as exc:
        _err(f"malformed trace: {exc}")
        return 1
    dirs = args.policy_dir or [shipped_policy_dir(), ADMIN_POLICY_DIR]
    try:
        policy = resolve_policy(args.policy, dirs)
    except FileNotFoundError as exc:
        _err(f"{exc}")
        return 2
    except PolicyErrors as exc:
        for e in exc.errors:
            print(e.format(), file=sys.stderr)
        # a policy file that cannot be read (a directory, no permission) is a usage problem, as in check
        return 2 if all(e.message.startswith("cannot read") for e in exc.errors) else 1
    for w in policy.warnings:
        _err(f"warning: {w}")
    try:
        trace = parse_trace(text, args.trace)
    except TraceError as exc:
        _err(f"malformed trace: {exc}")
        return 1
    profiles = _profiles(args, trace)
    if isinstance(profiles, str):
        _err(profiles)
        return 2
    doc = replay(trace, profiles, policy)
    for gap in doc["summary"].get("gaps", ()):
        _err(f"warning: {args.trace}:{gap['line']}: {span_text(gap['seconds'])} since the sample of line "
             f"{gap['after_line']}: the log stopped; that time is left out of the energy and state totals")
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        print_text(doc, policy.name, args.trace, [p.name for p in profiles])
    return 0
