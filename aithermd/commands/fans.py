"""``aithermd fans``: find which fan input follows which pwm (``detect``), measure each pwm's start and stop
duty and RPM curve (``calibrate``), and ``show`` what is stored.

``detect`` and ``calibrate`` write the pwm outputs (root), each journaled first and restored after
(:mod:`aithermd.fans.lab`): a time limit, an abort on a temperature rising past a margin, Ctrl-C and
SIGTERM all restore; after SIGKILL, ``aithermd restore`` (or the daemon's next start) does. They refuse to
run beside a daemon on the same state directory (stop it first: it owns the fans), and store the result in
the state directory (``fans.json``), which the daemon reads when it starts. ``--simulate`` runs them on the
simulated workstation (its own temporary state directory unless one is given). Exit codes: 0 done,
1 aborted or failed (every pwm restored; the message says why), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aithermd.files import path_arg

HELP = "find which fan follows which pwm (detect), measure start/stop duty (calibrate), show them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fans_verb", metavar="VERB")
    verbs = {"detect": "step each pwm and watch every fan input: which follows which, which header is empty",
             "calibrate": "per pwm: RPM at each duty, start duty (from standstill), stop duty (from running)",
             "show": "print what detection and calibration stored"}
    for verb, text in verbs.items():
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument("--state-dir", type=path_arg, metavar="DIR",
                       help="state directory (default: the config's, else /var/lib/aithermd)")
        p.add_argument("--config", type=path_arg, metavar="FILE",
                       help="settings file, for its state_dir and sysfs_root")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        if verb == "show":
            continue
        p.add_argument("--sysfs-root", type=path_arg, metavar="DIR",
                       help="sysfs root (default: the config's, else /sys)")
        p.add_argument("--pwm", action="append", default=[], metavar="ID",
                       help="only this pwm knob (repeatable; default: every writable one)")
        p.add_argument("--time-limit", type=float, default=None, metavar="S",
                       help="abort and restore after S seconds (default 900 for detect, 3600 for calibrate)")
        p.add_argument("--margin", type=float, default=10.0, metavar="C",
                       help="abort and restore when a temperature rose C °C above its start (default 10)")
        p.add_argument("--yes", action="store_true", help="do not ask before stopping fans")
        p.add_argument("--simulate", action="store_true", help="on the simulated workstation")
        p.add_argument("--speedup", type=float, default=0.0, metavar="K",
                       help="--simulate: simulated time runs K times faster than wall time (0: no waiting)")
        p.add_argument("--seed", type=int, default=0, help="--simulate: noise seed")


def run(args: argparse.Namespace) -> int:
    from aithermd import log

    if not args.fans_verb:
        print("usage: aithermd fans {detect,calibrate,show} ... (aithermd fans --help)", file=sys.stderr)
        return 2
    log.setup("warning", "auto")
    if args.fans_verb == "show":
        return _show(args)
    default_limit = 900.0 if args.fans_verb == "detect" else 3600.0
    limit = args.time_limit if args.time_limit is not None else default_limit
    if not (limit > 0 and args.margin > 0 and args.speedup >= 0):
        print("aithermd fans: --time-limit and --margin must be > 0, --speedup ≥ 0", file=sys.stderr)
        return 2
    return _lab_run(args, limit)


def _no_pwm(devices: Any, sysfs_root: Any) -> str:
    """Why there is no writable pwm to detect or calibrate: none at all (this machine's own sysfs is what
    is read, not a daemon's or a demo's), not root, or what the kernel said."""
    import os

    from aithermd.model import KnobKind

    pwms = [k for d in devices for k in d.knobs if k.kind is KnobKind.PWM]
    if not pwms:
        return (f"no hwmon pwm under {sysfs_root}: this machine has no fan header it can drive (detection runs "
                "on this machine's own sysfs, never on a daemon's or a demo's: --simulate runs it on the "
                "simulated workstation)")
    if os.geteuid() != 0:
        return f"{len(pwms)} pwm(s) here, none writable by uid {os.geteuid()}: run it as root"
    return f"{len(pwms)} pwm(s) here, none writable: {pwms[0].id}: {pwms[0].why_not or 'no reason given'}"


def _settings(args: argparse.Namespace) -> Any:
    from aithermd.errors import PolicyErrors
    from aithermd.settings import DaemonSettings, load_settings

    try:
        settings = load_settings(args.config)
    except PolicyErrors as exc:
        print(f"warning: {exc}; using the defaults", file=sys.stderr)
        settings = DaemonSettings()
    update = {k: v for k, v in (("state_dir", args.state_dir),
                                ("sysfs_root", getattr(args, "sysfs_root", None))) if v is not None}
    return settings.replace(**update)


def _show(args: argparse.Namespace) -> int:
    from aithermd.fans.store import FanStoreError, load

    state_dir = _settings(args).state_dir
    try:
        setup = load(state_dir)
    except FanStoreError as exc:
        print(f"aithermd fans show: {exc}", file=sys.stderr)
        return 1
    if setup is None:
        print(f"no fan detection stored in {state_dir}: run 'aithermd fans detect' (root)")
        return 0
    print(json.dumps(setup.to_json(), indent=1) if args.json else "\n".join(table(setup)))
    return 0


def table(setup: Any) -> list[str]:
    """Lines for people: per pwm its fan inputs, start and stop duty, speed at full, driver levels."""
    def short(channel: str) -> str:
        return channel.rsplit("/", 1)[-1]

    rows = [("pwm", "fan inputs", "starts", "stops", "full speed", "levels")]
    for knob_id, cal in setup.pwms.items():
        fans = ", ".join(short(t) for t in cal.tachs) or "(empty header)"
        pct = (lambda v: "—" if v is None else f"{v:.1f} %")  # noqa: E731
        full = ", ".join(f"{short(t)} {max(r for _, r in pts):.0f} RPM" for t, pts in cal.rpm.items() if pts)
        levels = f"{len(cal.levels)}" if cal.levels else ("all" if cal.calibrated else "—")
        rows.append((knob_id, fans, pct(cal.start_pct), pct(cal.stop_pct), full or "—", levels))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"{t}: nothing connected (reads 0 RPM)" for t in setup.idle]
    lines += [f"{t}: turns but follows no pwm (fixed power)" for t in setup.free]
    return lines


def _lock(state_dir: Path, sysfs_root: Path) -> Any:
    """Hold the daemon's own locks (:class:`aithermd.runtime.instance.InstanceLock`: the state directory,
    and the machine's in /run) for the session: refused beside a running daemon, and a daemon started
    meanwhile refuses to start. Raises SystemExit(1) when held."""
    from aithermd.runtime.instance import AlreadyRunning, InstanceLock

    lock = InstanceLock(state_dir, sysfs_root)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        print(f"aithermd fans: {exc}; then start it again to use the result", file=sys.stderr)
        raise SystemExit(1) from None
    return lock


def _confirm(args: argparse.Namespace) -> bool:
    if args.yes or args.simulate:
        return True
    text = ("aithermd fans: each fan output will be stopped or slowed in turn for a few seconds; each is "
            f"restored afterwards (abort: Ctrl-C; a temperature {args.margin:g} °C above its start aborts)")
    if not sys.stdin.isatty():
        print(f"{text}.\naithermd fans: not a terminal: give --yes to go ahead", file=sys.stderr)
        raise SystemExit(2)  # a usage error: the flag the command needs here is missing
    print(text + ".")
    return input("continue? [y/N] ").strip().lower() in ("y", "yes")


def _lab_run(args: argparse.Namespace, limit: float) -> int:
    from aithermd.actuate.journal import Journal, JournalError
    from aithermd.actuate.restore import restore_journal
    from aithermd.fans import calibrate, detect
    from aithermd.fans.lab import Lab, LabAborted, LabOptions
    from aithermd.fans.store import FanStoreError, load, save

    settings = _settings(args)
    rig = _SimRig(args) if args.simulate else _RealRig(settings.sysfs_root, settings.state_dir)
    state_dir = rig.state_dir
    if not _confirm(args):
        return 1
    lock = _lock(state_dir, rig.sysfs_root)
    backend = None
    try:
        journal = Journal(state_dir)
        backend, devices = rig.backend()
        if journal.dirty:  # a session or daemon that was killed: put those pwms back first
            print(f"restoring the {len(journal.entries())} knob(s) an earlier run left journaled")
            restore_journal(journal, backends=[backend])
        pwms = args.pwm or detect.writable_pwms(devices)
        unknown = [p for p in pwms if p not in detect.writable_pwms(devices)]
        if unknown:
            print(f"aithermd fans: not a writable pwm here: {', '.join(unknown)}", file=sys.stderr)
            return 2
        if not pwms:
            print(f"aithermd fans: {_no_pwm(devices, rig.sysfs_root)}", file=sys.stderr)
            return 1
        try:
            previous = load(state_dir)
        except FanStoreError as exc:
            print(f"warning: {exc}; starting afresh", file=sys.stderr)
            previous = None
        lab = Lab(backend, devices, journal, clock=rig.clock, sleep=rig.sleep,
                  options=LabOptions(time_limit_s=limit, margin_c=args.margin), say=print)
        previous_handlers = {s: signal.signal(s, lambda n, f: lab.stop(signal.Signals(n).name))
                             for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            with lab:
                setup = previous
                known = setup is not None and all(p in setup.pwms for p in pwms)
                if args.fans_verb == "detect" or not known:
                    found = detect.detect(lab, pwms, detect.fan_inputs(devices),
                                          complete=set(pwms) == set(detect.writable_pwms(devices)))
                    print("\n".join(detect.report(found)))
                    if found.suspect is not None:
                        print(f"aithermd fans: {found.suspect}; nothing stored, every pwm is put back",
                              file=sys.stderr)
                        return 1
                    setup = found.setup(rig.clock.wall(), previous)
                if args.fans_verb == "calibrate":
                    assert setup is not None
                    setup = calibrate.calibrate(lab, setup, pwms, rig.clock.wall())
        except LabAborted as exc:
            print(f"aithermd fans: aborted: {exc}; every pwm restored", file=sys.stderr)
            return 1
        finally:
            for s, h in previous_handlers.items():
                signal.signal(s, h)
        if lab.restored is not None and not lab.restored.ok:
            return 1
        path = save(state_dir, setup)
        print(json.dumps(setup.to_json(), indent=1) if args.json else "\n".join(table(setup)))
        if args.simulate and args.state_dir is None:
            print("a simulation on a temporary state directory: nothing kept (--state-dir DIR keeps "
                  "fans.json)")
        else:
            print(f"saved to {path}; the daemon uses it from its next start")
        rig.done = True
        return 0
    except JournalError as exc:
        print(f"aithermd fans: {exc}", file=sys.stderr)
        return 1
    finally:
        if backend is not None:
            backend.close()
        rig.close()
        lock.release()


class _RealRig:
    """The machine's own hwmon under ``sysfs_root``, on the real clock."""

    def __init__(self, sysfs_root: Path, state_dir: Path) -> None:
        from aithermd.clock import RealClock

        self.sysfs_root, self.state_dir = sysfs_root, state_dir
        self.clock, self.sleep = RealClock(), time.sleep
        self.done = False

    def backend(self) -> tuple[Any, list[Any]]:
        from aithermd.backends.hwmon import HwmonBackend

        backend = HwmonBackend(str(self.sysfs_root))
        return backend, backend.discover()

    def close(self) -> None:
        pass


class _SimRig:
    """The simulated workstation in a directory of its own (inside the state directory when one is given,
    so ``aithermd restore --state-dir`` finds it after a crash), on its simulated clock."""

    def __init__(self, args: argparse.Namespace) -> None:
        from aithermd.sim.fanlab import sim_sleep
        from aithermd.sim.machine import SimulatedMachine
        from aithermd.sim.runner import SimClock, make_places
        from aithermd.sim.workload import CycleWorkload

        self.places = make_places(args.state_dir)
        self.state_dir = self.places.state_dir
        self.clock = SimClock()
        idle = CycleWorkload(idle_before_s=86_400.0, training_s=0.0, idle_after_s=0.0, seed=args.seed)
        self.machine = SimulatedMachine(self.places.machine_dir, seed=args.seed, wall_start=self.clock.wall(),
                                        workload=idle)  # fans are calibrated on an idle machine
        self.sleep = sim_sleep(self.machine, self.clock, args.speedup)
        self.sysfs_root = self.machine.sysfs_root
        self.done = False
        print(f"simulated workstation in {self.places.machine_dir}; state in {self.state_dir}", flush=True)

    def backend(self) -> tuple[Any, list[Any]]:
        from aithermd.backends.hwmon import HwmonBackend

        backend = HwmonBackend(str(self.machine.sysfs_root), io=self.machine.board.io())
        return backend, backend.discover()

    def close(self) -> None:
        """The machine's files go after a clean run (a temporary state directory with them)."""
        from aithermd.sim.runner import cleanup

        self.machine.close()
        if self.done:
            cleanup(self.places)
