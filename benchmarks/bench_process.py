"""aithermd as users see it: the whole daemon process, in real time at 1 Hz, beside a lean reference loop.

What runs (issue 22). For each scenario the benchmark generates a fake hwmon tree and starts, side by side
on their own copies of it, the real daemon (``python -m aithermd run``: hwmon, CPU and NVML backends, the
policy engine, journal, history, Prometheus on, D-Bus off, the fast lane's thread, logs at info on stderr),
the lean single-loop Python controller of ``lean_loop.py`` doing the same job with the same libraries, and
optionally the daemon of an older checkout (``--before DIR``) and fan2go (``--fan2go BIN`` or ``$FAN2GO``).
A writer moves every temperature of every copy by the same seeded random walk once a second, so curves move
and fans are written. Scenarios (:data:`SCENARIOS`): the reference tree (one nct6798 with 6 temperatures, 3
fans, 3 pwm; the policy ``reference-policy.yaml``), the same with 2 and 8 simulated GPUs (the fake NVML beneath the
real ``pynvml``, in both peers: ``fakegpus.py``), and trees of 100 and 500 hwmon channels.

How it measures. The trees live in memory (``/dev/shm``, :func:`memory_dir`), as sysfs does. Every
process of every scenario runs at once, each started at its own phase of the second;
after ``--warmup`` s, CPU (the summed ``/proc/PID/task/*/schedstat`` run time of every thread, to the ns;
utime + stime of ``/proc/PID/stat`` is counted in 10 ms scheduler ticks, too coarse for a few ms a second,
and is kept in the JSON as a cross-check) and RSS (``VmRSS``) of every process are read at the same
instants at the edges of ``--windows`` windows of ``--window`` s, so load from anything else on the
machine falls on all peers alike. CPU per tick is the
window's CPU / ticks in it; the figure is the median over windows (range in brackets). Ratios are to the
lean loop of the same scenario in the same run. Marginal costs: (500 − 100 channels) / 400 and (8 − 2
GPUs) / 6. Then ``/metrics`` is scraped round-robin over loopback as Prometheus does (one connection per
scrape, rounds ``--scrape-interval`` apart: each scrape sees a tick its exporter has not rendered yet, as
one every 15 s would; back to back, the exporter's per-tick cache would answer most of them; the order
rotates from round to round, as the first scrape after the pause is the dearest) and its p50 reported. Start-up: CPU of the process when it sends ``READY=1`` (after its first tick) to
``$NOTIFY_SOCKET``, median of ``--startups`` starts, each a first start on a fresh state directory and a
restart on the same one (the policies' parsed documents then come from it; a first start takes the
shipped policies' documents from the package's data and parses the benchmark's own policy, which no cache
holds, in the parser child, whose CPU is counted: cold for that file). aithermctl: wall time of ``--help`` and of ``status``
against the real daemon on a private ``dbus-daemon``.

Goals on this kind of machine (2 cores; ratios from the same run): :data:`GOALS`. ``--smoke`` runs a few
seconds of everything on the reference scenario only, checks that every peer ticked and served, and
judges nothing (CI runs it; no time is asserted). The history needs 900 s to fill, so RSS is steady only
with ``--warmup 900`` or more; shorter runs say so.

    .venv/bin/python benchmarks/bench_process.py [--before DIR] [--fan2go BIN] [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import procpeers  # noqa: E402
from procpeers import Peer  # noqa: E402
from reference_tree import TEMPS_MC, reference_chip  # noqa: E402

SCENARIOS = {  # name → (simulated GPUs, hwmon channels; 0 = the reference chip's 9)
    "reference": (0, 0), "gpu2": (2, 0), "gpu8": (8, 0), "hwmon100": (0, 100), "hwmon500": (0, 500)}
GOALS = {
    "tick_ms": 0.6, "tick_vs_lean": 1.0, "tick_vs_fan2go": 0.3, "channel_us": 2.0, "gpu_ms": 0.3,
    "rss_mb": 42.0, "rss_vs_lean": 1.0, "growth_mb_h": 0.0, "history_mb_500": 5.0, "metrics_p50_ms": 0.8,
    "startup_cpu_s": 0.3, "ctl_help_ms": 100.0, "ctl_status_ms": 250.0}
HISTORY_S = 900.0


def memory_dir() -> str | None:
    """Where the trees are made: ``/dev/shm`` (tmpfs) when it is a writable directory, as sysfs is in memory.
    On a disk file system each write of a pwm file (``O_TRUNC``, as a shell's ``>``, and so the daemon and
    the lean loop alike) costs its writer about 70 µs of CPU and 2.4 ms of waiting on ext4 (the flush on
    close after a truncate, on the build VM), which no sysfs attribute does."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def build_tree(root: Path, channels: int) -> list[Path]:
    """The reference chip (6 temperatures, 3 fans, 3 pwm) and, for ``channels`` > 9, more chips of up to 32
    temperature inputs until the tree has ``channels`` hwmon channels. Returns every temp*_input file."""
    files = reference_chip(root)
    extra, k = max(0, channels - 9), 1
    while extra > 0:
        more = root / "class" / "hwmon" / f"hwmon{k}"
        more.mkdir(parents=True)
        (more / "name").write_text(f"lm{75 + k}\n")
        for i in range(1, min(32, extra) + 1):
            (more / f"temp{i}_input").write_text(f"{30_000 + i}\n")
            files.append(more / f"temp{i}_input")
        extra, k = extra - 32, k + 1
    return files


class Walker(threading.Thread):
    """Moves every temperature of every tree copy once a second by the same seeded random walk (m°C, 25–88 °C)."""

    def __init__(self, trees: list[list[Path]], seed: int = 1) -> None:
        super().__init__(name="walker", daemon=True)
        self.trees, self.rng, self.stop = trees, random.Random(seed), threading.Event()

    def run(self) -> None:
        width = max((len(t) for t in self.trees), default=0)
        values = [(TEMPS_MC[i] if i < len(TEMPS_MC) else 30_000 + 7 * i) for i in range(width)]
        while not self.stop.wait(1.0):
            for i in range(width):
                lo, hi = (30_000, 88_000) if i < 2 else (25_000, 60_000)
                values[i] = min(hi, max(lo, values[i] + self.rng.choice((-1500, -500, 0, 500, 1500))))
            for files in self.trees:
                for i, path in enumerate(files):
                    # in place, same width (5 digits): a reader never sees a truncated file, as in sysfs
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        os.pwrite(fd, f"{values[i]:05d}\n".encode(), 0)
                    finally:
                        os.close(fd)


def window_figures(peers: list[Peer], warmup_s: float, windows: int, window_s: float) -> None:
    """Read every peer's CPU and RSS at the same instants at the window edges (into ``peer.marks``)."""
    time.sleep(warmup_s)
    for w in range(windows + 1):
        if w:
            time.sleep(window_s)
        now = time.monotonic()
        for p in peers:
            p.mark(now)


def median_tick_ms(p: Peer, field: int = 1) -> tuple[float, float, float]:
    """CPU ms per 1 Hz tick in each window: median, min, max (``field`` 1: schedstat, 3: utime+stime)."""
    per = [(b[field] - a[field]) * 1000.0 / (b[0] - a[0]) for a, b in zip(p.marks, p.marks[1:], strict=False)]
    return statistics.median(per), min(per), max(per)


def run_windows(args: argparse.Namespace, work: Path, scenarios: list[str]) -> dict[str, dict[str, Peer]]:
    policy_dir = work / "policies"
    by_scenario: dict[str, dict[str, Peer]] = {}
    trees = []
    for name in scenarios:
        gpus, channels = SCENARIOS[name]
        peers = {}
        for kind in args.kinds:
            if kind == "fan2go" and name != "reference":
                continue
            tree = work / name / kind
            trees.append(build_tree(tree / "sys", channels))
            peers[kind] = Peer(kind, name, tree, gpus, policy_dir, args)
        by_scenario[name] = peers
    walker = Walker(trees)
    walker.start()
    everyone = [p for peers in by_scenario.values() for p in peers.values()]
    try:
        for i, p in enumerate(everyone):
            p.start()
            time.sleep(1.0 / len(everyone))  # each at its own phase of the second
        for p in everyone:
            p.wait_ready(60.0)
        window_figures(everyone, args.warmup, args.windows, args.window)
        for p in everyone:
            p.check_alive()
        for name, peers in by_scenario.items():
            served = [p for p in peers.values() if p.port]
            for r in range(args.scrapes):
                # the first scrape after the pause pays the scraper's own cold start (0.15-0.4 ms here):
                # each peer takes each place in turn
                for p in served[r % len(served):] + served[:r % len(served)]:
                    p.scrape()
                time.sleep(args.scrape_interval)  # a scrape a tick at most, as Prometheus's are
            for p in served:  # every peer ticked and controlled its fans
                want = {"after": b"aithermd_fan_duty_ratio{", "before": b"aithermd_fan_duty_ratio{",
                        "lean": b"lean_fan_duty_ratio{"}.get(p.kind, b"")
                if want not in p.body:
                    raise SystemExit(f"{p.kind} ({name}): no {want.decode()} in /metrics")
    finally:
        walker.stop.set()
        for p in everyone:
            p.stop()
    return by_scenario


def startup_figures(args: argparse.Namespace, work: Path) -> dict[str, list[tuple[float, float]]]:
    """(CPU s, wall s) to READY=1 of each kind (not fan2go), started one after another, ``--startups`` rounds:
    the first start on a fresh state directory (``KIND``), then a restart on the same one (``KIND restart``:
    what a boot or ``systemctl restart`` costs, the policies' parsed documents already kept there)."""
    policy_dir = work / "policies"
    out: dict[str, list[tuple[float, float]]] = {}
    kinds = [k for k in args.kinds if k != "fan2go"]
    for r in range(args.startups):
        for kind in kinds:
            tree = work / "startup" / f"{kind}-{r}"
            build_tree(tree / "sys", 0)
            for label in (kind, f"{kind} restart"):
                (tree / "notify").unlink(missing_ok=True)
                p = Peer(kind, "startup", tree, 0, policy_dir, args)
                try:
                    p.start()
                    out.setdefault(label, []).append(p.wait_ready(60.0))
                finally:
                    p.stop()
    return out


def ctl_figures(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    """Median wall ms of ``aithermctl --help`` and ``aithermctl status`` (against the real daemon) per kind."""
    out: dict[str, dict[str, float]] = {}
    if shutil.which("dbus-daemon") is None:
        return out
    for kind in [k for k in args.kinds if k in ("after", "before")]:
        with procpeers.private_bus(work / f"bus-{kind}") as address:
            tree = work / "ctl" / kind
            build_tree(tree / "sys", 0)
            p = Peer(kind, "ctl", tree, 0, work / "policies", args, bus=address)
            try:
                p.start()
                p.wait_ready(60.0)
                out[kind] = {"help": procpeers.timed_ctl(kind, args, ["--help"], args.ctl_runs),
                             "status": procpeers.timed_ctl(kind, args, ["--bus", address, "status"],
                                                           args.ctl_runs)}
            finally:
                p.stop()
    return out


def report(args: argparse.Namespace, runs: dict[str, dict[str, Peer]], starts: dict[str, list[tuple]],
           ctl: dict[str, dict[str, float]]) -> dict:
    """Print the table and each goal; returns the figures as a document."""
    doc: dict = {"args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | list)},
                 "scenarios": {}, "goals": []}
    kinds = [k for k in ("before", "after", "lean", "fan2go") if k in args.kinds]
    full = args.warmup >= HISTORY_S
    print(f"\nwhole-process figures, 1 Hz, median of {args.windows} windows of {args.window:g} s after "
          f"{args.warmup:g} s ({'history full' if full else 'history NOT yet full: RSS still filling'})")
    print(f"{'scenario':<11}{'figure':<24}" + "".join(f"{k:>20}" for k in kinds) + f"{'after/lean':>12}")
    for name, peers in runs.items():
        sdoc = doc["scenarios"][name] = {}
        rows = {"CPU ms/tick": {}, "RSS MB (start→end)": {}, "/metrics p50 ms": {}}
        for kind, p in peers.items():
            med, lo, hi = median_tick_ms(p)
            rss0, rss1 = p.marks[0][2], p.marks[-1][2]
            hours = (p.marks[-1][0] - p.marks[0][0]) / 3600.0
            p50 = statistics.median(p.scrapes) * 1000.0 if p.scrapes else None
            stat = (p.marks[-1][3] - p.marks[0][3]) * 1000.0 / (p.marks[-1][0] - p.marks[0][0])
            sdoc[kind] = {"tick_ms": med, "tick_ms_range": [lo, hi], "tick_ms_utime_stime": stat,
                          "rss0_mb": rss0, "rss_mb": rss1,
                          "growth_mb_h": (rss1 - rss0) / hours if hours else 0.0, "metrics_p50_ms": p50}
            rows["CPU ms/tick"][kind] = f"{med:.3f} [{lo:.2f}-{hi:.2f}]"
            rows["RSS MB (start→end)"][kind] = f"{rss0:.1f}→{rss1:.1f}"
            rows["/metrics p50 ms"][kind] = f"{p50:.3f}" if p50 is not None else "-"
        for figure, cells in rows.items():
            ratio = ""
            if "after" in sdoc and "lean" in sdoc:
                key = {"CPU ms/tick": "tick_ms", "RSS MB (start→end)": "rss_mb",
                       "/metrics p50 ms": "metrics_p50_ms"}[figure]
                a, b = sdoc["after"][key], sdoc["lean"][key]
                ratio = f"{a / b:.2f}×" if a is not None and b else ""
            print(f"{name:<11}{figure:<24}" + "".join(f"{cells.get(k, '-'):>20}" for k in kinds) + f"{ratio:>12}")
    for kind, figs in starts.items():
        cpu, wall = statistics.median(f[0] for f in figs), statistics.median(f[1] for f in figs)
        doc.setdefault("startup", {})[kind] = {"cpu_s": cpu, "wall_s": wall}
        print(f"{'start-up':<11}{'CPU s to first tick':<24}{kind:>20}{cpu:>10.3f} (wall {wall:.3f} s)")
    for kind, figs in ctl.items():
        doc.setdefault("ctl", {})[kind] = figs
        print(f"{'aithermctl':<11}{'--help / status ms':<24}{kind:>20}{figs['help']:>10.1f} / "
              f"{figs['status']:.1f}")
    goals(args, doc, full)
    return doc


def _marginal(doc: dict, kind: str, a: str, b: str, n: float) -> float | None:
    s = doc["scenarios"]
    if a in s and b in s and kind in s[a] and kind in s[b]:
        return (s[b][kind]["tick_ms"] - s[a][kind]["tick_ms"]) / n
    return None


def goals(args: argparse.Namespace, doc: dict, full: bool) -> None:
    s = doc["scenarios"]
    ref = s.get("reference", {})
    rows = []

    def goal(name: str, unit: str, target: float, kind_value: dict, ratio: str = "") -> None:
        value = kind_value.get("after")
        before = kind_value.get("before")
        ok = value is not None and value <= target
        rows.append({"goal": name, "target": target, "unit": unit, "after": value, "before": before,
                     "ratio": ratio, "met": ok if value is not None else None})

    def per(key: str, scen: str = "reference") -> dict:
        return {k: v[key] for k, v in s.get(scen, {}).items() if v.get(key) is not None}

    def ratio(key: str, a: str, b: str, scen: str = "reference") -> dict:
        x = s.get(scen, {})
        return {k: x[k][key] / x[b][key] for k in (a, "before") if k in x and b in x and x[b][key]}

    goal("reference tick CPU", "ms", GOALS["tick_ms"], per("tick_ms"))
    goal("reference tick / lean loop", "×", GOALS["tick_vs_lean"], ratio("tick_ms", "after", "lean"))
    if "fan2go" in ref:
        goal("reference tick / fan2go", "×", GOALS["tick_vs_fan2go"], ratio("tick_ms", "after", "fan2go"))
    else:
        rows.append({"goal": "reference tick / fan2go", "target": GOALS["tick_vs_fan2go"], "unit": "×",
                     "after": None, "before": None, "ratio": "", "met": None,
                     "note": "fan2go not measured (give --fan2go BIN or $FAN2GO)"})
    for kind_goal, a, b, n, unit, scale in (("channel_us", "hwmon100", "hwmon500", 400.0, "µs", 1000.0),
                                             ("gpu_ms", "gpu2", "gpu8", 6.0, "ms", 1.0)):
        vals = {k: v * scale for k in ("after", "before", "lean")
                if (v := _marginal(doc, k, a, b, n)) is not None}
        lean = vals.get("lean")
        goal(f"marginal per {'hwmon channel' if unit == 'µs' else 'simulated GPU'}", unit, GOALS[kind_goal],
             vals, f"{vals['after'] / lean:.2f}× lean" if lean and "after" in vals else "")
    goal("RSS steady (reference)", "MB", GOALS["rss_mb"], per("rss_mb"))
    goal("RSS / lean loop", "×", GOALS["rss_vs_lean"], ratio("rss_mb", "after", "lean"))
    goal("RSS growth over the windows" + ("" if full else " (history still filling)"), "MB/h",
         GOALS["growth_mb_h"] + 1.0, per("growth_mb_h"))
    if "hwmon500" in s and "hwmon100" in s:
        goal("RSS 500 − 100 channels (history)", "MB", GOALS["history_mb_500"],
             {k: s["hwmon500"][k]["rss_mb"] - s["hwmon100"][k]["rss_mb"] for k in s["hwmon500"]
              if k in s["hwmon100"]})
    goal("/metrics p50 (reference)", "ms", GOALS["metrics_p50_ms"], per("metrics_p50_ms"))
    starts = doc.get("startup", {})
    goal("start-up CPU to first tick (first start)", "s", GOALS["startup_cpu_s"],
         {k: v["cpu_s"] for k, v in starts.items() if " " not in k})
    goal("start-up CPU to first tick (restart)", "s", GOALS["startup_cpu_s"],
         {k.split()[0]: v["cpu_s"] for k, v in starts.items() if k.endswith(" restart")})
    goal("aithermctl --help wall", "ms", GOALS["ctl_help_ms"], {k: v["help"] for k, v in doc.get("ctl", {}).items()})
    goal("aithermctl status wall", "ms", GOALS["ctl_status_ms"],
         {k: v["status"] for k, v in doc.get("ctl", {}).items()})
    doc["goals"] = rows
    print("\ngoals (after = this tree" + (", before = --before" if "before" in args.kinds else "") + ")")
    for r in rows:
        fmt = (lambda v: "-" if v is None else f"{v:.3f}")
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[r["met"]]
        if args.smoke:
            verdict = "smoke: not judged"
        print(f"  {r['goal']:<44} ≤ {r['target']:g} {r['unit']:<5} after {fmt(r['after']):>9}"
              f"   before {fmt(r['before']):>9}  {r['ratio']:<14} {verdict}  {r.get('note', '')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=120.0, help="s before the first window")
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--window", type=float, default=60.0, help="s per window")
    parser.add_argument("--scenarios", help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--before", type=Path, metavar="DIR", help="checkout of an older aithermd to run beside")
    parser.add_argument("--fan2go", type=Path, default=os.environ.get("FAN2GO") or None, metavar="BIN")
    parser.add_argument("--startups", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=60)
    parser.add_argument("--scrape-interval", type=float, default=1.1, metavar="S",
                        help="s between rounds of scrapes (default 1.1: each scrape sees a new tick, as a "
                             "Prometheus scraping every 15 s does; 0: back to back, mostly cached renders)")
    parser.add_argument("--ctl-runs", type=int, default=15)
    parser.add_argument("--without-after", action="store_true",
                        help="run only --before and the peers (to record figures of an older checkout)")
    parser.add_argument("--start-order", metavar="KIND,...",
                        help="the order the peers of each scenario start in (default after,lean,before,"
                             "fan2go). On the 2-core build VM the process started first costs up to ~15 %% "
                             "more: compare --before runs in both orders")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures here too")
    parser.add_argument("--smoke", action="store_true", help="seconds of everything; checks, judges nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.warmup, args.windows, args.window, args.startups, args.scrapes, args.ctl_runs = 2, 2, 2.0, 1, 3, 1
        args.scrape_interval = 0.0
        args.scenarios = args.scenarios or "reference"
    args.kinds = ([] if args.without_after and args.before else ["after"]) + ["lean"] + (
        ["before"] if args.before else []) + (["fan2go"] if args.fan2go else [])
    if args.start_order:
        order = [k.strip() for k in args.start_order.split(",") if k.strip()]
        if sorted(order) != sorted(args.kinds):
            parser.error(f"--start-order must name each of {', '.join(args.kinds)} once")
        args.kinds = order
    scenarios = [s.strip() for s in (args.scenarios or ",".join(SCENARIOS)).split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="aithermd-bench-", dir=memory_dir()) as tmp:
        work = Path(tmp)
        procpeers.prepare(args, work)
        starts = startup_figures(args, work)
        ctl = ctl_figures(args, work)
        runs = run_windows(args, work, scenarios)
    doc = report(args, runs, starts, ctl)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
