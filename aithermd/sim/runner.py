"""``aithermd run --simulate``: the whole daemon, its real code paths, on a simulated workstation.

:func:`simulate` (``run_simulated`` for the command line) builds a :class:`~aithermd.sim.machine.
SimulatedMachine` in a directory of its own, a simulated clock, and the daemon (:class:`aithermd.runtime.
daemon.Daemon`) with :func:`build_backends`: the real hwmon/powercap backends, the real NVML backend over
the fake NVML, the real CPU backend reading the simulated CPU. Before each sample the physics advance to the
tick's simulated time, which moves only while the daemon sleeps: ``speedup`` K makes a simulated second
1/K s of wall time (0 = no waiting). ``--bus``/``--metrics-listen`` default to ``none`` (``aithermctl
demo`` gives a private bus).

State: a temporary state directory unless one is given, so a simulation never leaves a journal that a real
``aithermd restore`` would apply to real hardware. The machine's files (board tree, fake NVML state) live
in a temporary directory, inside the state directory when one is given, so that after a crash ``aithermd
restore --state-dir DIR`` finds every knob the journal names. Both go after a clean run that made them.
"""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from aithermd.clock import FakeClock
from aithermd.model import Event, Snapshot
from aithermd.sim import report
from aithermd.sim.options import MAX_STEP_S, SimOptions, add_arguments, options_from_args
from aithermd.sim.recorder import Recorder

__all__ = ["MAX_STEP_S", "SimOptions", "SimResult", "add_arguments", "options_from_args", "run_simulated",
           "simulate"]
from aithermd.sim.fanlab import calibrate_twin

if TYPE_CHECKING:  # the machine pulls in the fake NVML and pynvml: only when a simulation runs
    from aithermd.sim.machine import SimulatedMachine
    from aithermd.sim.workload import Workload



class SimClock(FakeClock):
    """Simulated monotonic and wall time, moved only by :meth:`advance` (the daemon's sleep); wall time
    starts now unless ``wall_start`` is given."""

    def __init__(self, start: float = 1000.0, wall_start: float | None = None) -> None:
        super().__init__(start, time.time() if wall_start is None else wall_start)


def sim_sleep(clock: SimClock, speedup: float) -> Callable[[float], Any]:
    """The daemon's sleep: move the simulated clock by ``s`` once the wall clock has caught up with
    simulated time / ``speedup`` (paced from the first sleep, so the time ticks take counts too; no
    waiting when ``speedup`` is 0). A cancelled sleep (stop requested) moves nothing."""
    anchor: list[float] = []

    async def sleep(seconds: float) -> None:
        if speedup > 0:
            if not anchor:
                anchor.extend((time.monotonic(), clock.monotonic()))
            due = anchor[0] + (clock.monotonic() + seconds - anchor[1]) / speedup
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        else:
            await asyncio.sleep(0)
        clock.advance(seconds)

    return sleep


def machine_profiles(paths: Sequence[Path], gpus: int | None = None) -> list[Any] | None:
    """The GPUs of ``--gpu-profile`` dumps (every GPU of each, in order; the first ``gpus`` of them, repeated
    when fewer), or None for the default pair. Raises :class:`~aithermd.sim.smi_dump.DumpError` for a bad
    dump, ValueError for a GPU the simulator cannot model or a count outside 1–16, before anything starts."""
    from aithermd.sim.gpu_model import GpuParams
    from aithermd.sim.machine import default_profiles
    from aithermd.sim.profiles import load_profiles

    profiles = load_profiles(paths) if paths else None
    if gpus is not None:
        if not 1 <= gpus <= 16:
            raise ValueError(f"--gpus must be 1 to 16, not {gpus}")
        pool = profiles or default_profiles()
        profiles = [pool[i % len(pool)] for i in range(gpus)]
    for prof in profiles or ():
        GpuParams.from_profile(prof)
    return profiles


def _gone(gpu: Any) -> str | None:
    """``"lost"`` (off the bus: GPU_IS_LOST), ``"removed"`` (not enumerated) or None, for a progress line."""
    return "removed" if gpu.removed else "lost" if gpu.lost else None


def make_workload(opts: SimOptions, gpus: int = 1) -> Workload:
    """The trace's utilization (``--trace``), else the default idle → training → idle cycle; shifted per
    GPU by ``stagger_s`` when given (:mod:`aithermd.sim.staggered`)."""
    from aithermd.sim.staggered import StaggeredWorkload
    from aithermd.sim.workload import CycleWorkload, load_trace

    if opts.workload is not None:
        load = opts.workload
    elif opts.trace is not None:
        load = load_trace(opts.trace)
    else:
        before, busy, after = opts.cycle or (120.0, 360.0, 120.0)
        load = CycleWorkload(before, busy, after, seed=opts.seed, busy_kind=opts.busy_kind,
                             held_idle=opts.held_idle)
    return StaggeredWorkload.every(load, opts.stagger_s, gpus) if opts.stagger_s else load


@dataclass
class Places:
    """Where a run keeps its files, and what to delete after a clean run."""

    state_dir: Path
    machine_dir: Path
    remove: tuple[Path, ...]


def make_places(state_dir: Path | None) -> Places:
    """A temporary state directory (unless given) and a fresh machine directory (inside the given state
    directory, else inside the temporary one)."""
    if state_dir is None:
        base = Path(tempfile.mkdtemp(prefix="aithermd-sim-"))
        (base / "state").mkdir()
        return Places(base / "state", base / "machine", (base,))
    state_dir.mkdir(parents=True, exist_ok=True)
    machine = Path(tempfile.mkdtemp(prefix="sim-machine-", dir=state_dir))
    return Places(state_dir, machine, (machine,))


def cleanup(places: Places) -> None:
    for path in places.remove:
        shutil.rmtree(path, ignore_errors=True)


def summary_data(machine: SimulatedMachine, recorder: Recorder, policy: str) -> dict[str, Any]:
    """The run's summary: the machine's totals (:meth:`SimulatedMachine.summary`), ``policy``, every
    ``actuations`` entry the daemon published (``t_s``, ``knob``, ``old``, ``new``, ``unit``, ``rule``,
    ``reason``; each GPU's ``limit_changes`` with the reason, :func:`report.with_reasons`),
    ``policy_states_s`` (``"policy/device"`` → state → seconds) and ``held_idle`` (GPU → ``first_s`` when
    the daemon first found it held high while idle, ``held_w``, ``floor_w``, ``recovered_w`` the most a
    clock lock took off, ``held_s``)."""
    data = {"policy": policy, **machine.summary(), "actuations": recorder.actuations,
            "held_idle": recorder.held_idle,
            "policy_states_s": {k: {s: round(v, 1) for s, v in d.items()}
                                for k, d in recorder.state_s.items()}}
    report.with_reasons(data["gpus"], recorder.actuations)
    return data


def build_backends(machine: SimulatedMachine, clock: SimClock, io: Any = None) -> list[Any]:
    """The daemon's backends on the simulated machine, on the simulated clock: real hwmon (through the board's
    drivers, or ``io``: the fault plan's FaultIO) and powercap on its sysfs root, real NVML over the real
    ``pynvml`` bindings with the fake NVML beneath, the real CPU backend on the simulated CPU."""
    from aithermd.backends.cpu import CpuBackend
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.backends.nvml import NvmlBackend
    from aithermd.backends.powercap import RaplBackend

    root = str(machine.sysfs_root)
    return [HwmonBackend(root, io=io or machine.board.io()), RaplBackend(root, clock=clock, io=io),
            CpuBackend(psutil_module=machine.psutil, clock=clock),
            NvmlBackend(nvml=machine.nvml.bindings(), clock=clock)]


REPORT_EVERY_S = 5.0  # how often a simulated job reports its rate (aithermctl run: every few seconds)


class Stepper:
    """``before_sample``: advance the machine to the tick's simulated time in steps of at most
    ``max_step_s`` (:data:`MAX_STEP_S`), turn the injected ``faults`` (a :class:`~aithermd.sim.faults.
    FaultPlan`) on and off, and print a progress line each simulated ``progress_s``. With ``report`` (a
    ``ReportProgress(gpus, rate)``), each GPU's busy job reports its rate every :data:`REPORT_EVERY_S`: the
    whole training steps it completed (:data:`aithermd.sim.loop.STEPS_PER_WORK` per second of full-speed
    work) over that time, as a training loop prints them and ``aithermctl run --progress-regex`` reads
    them; a GPU that did no work reports nothing."""

    def __init__(self, machine: SimulatedMachine, t0: float, out: TextIO | None,
                 progress_s: float = 30.0, faults: Any = None, max_step_s: float = MAX_STEP_S,
                 report: Callable[[list[str], float], None] | None = None) -> None:
        self.machine, self.t0, self.out, self.progress_s = machine, t0, out, progress_s
        self.faults, self.max_step_s, self.report = faults, max_step_s, report
        self._next_progress = 0.0
        self._steps = [0] * len(machine.gpus)  # whole steps done per GPU
        self._reported_t = 0.0

    def __call__(self, t_mono: float) -> None:
        target = t_mono - self.t0
        while self.machine.t_s < target - 1e-9:
            self.machine.step(min(self.max_step_s, target - self.machine.t_s))
        if self.faults is not None:
            done = len(self.faults.log)
            self.faults.apply(self.machine.t_s)
            if self.out is not None:
                for t_s, what, spec in self.faults.log[done:]:
                    self.out.write(report.fault_line(t_s, what, spec) + "\n")
        if self.report is not None and self.machine.t_s - self._reported_t >= REPORT_EVERY_S - 1e-9:
            self._report(self.machine.t_s - self._reported_t)
            self._reported_t = self.machine.t_s
        if self.out is not None and self.machine.t_s >= self._next_progress:
            self._next_progress += self.progress_s
            m = self.machine
            gpus = {f"gpu{i}": {"limit_w": m.nvml.power_limit_w(i), "temp_c": g.temp_c,
                                "power_w": m.nvml.gpu(i).power_mw / 1000.0, "gone": _gone(m.nvml.gpu(i))}
                    for i, g in enumerate(m.gpus)}
            self.out.write(report.progress_line(m.t_s, m.workload.phase(m.t_s), gpus) + "\n")
            self.out.flush()

    def _report(self, span_s: float) -> None:
        from aithermd.sim.loop import STEPS_PER_WORK

        for i, g in enumerate(self.machine.gpus):
            steps = math.floor(g.work * STEPS_PER_WORK)
            done, self._steps[i] = steps - self._steps[i], steps
            if done > 0 and self.report is not None:
                try:
                    self.report([f"gpu{i}"], done / span_s)
                except Exception:  # noqa: BLE001 - as aithermctl run: a refused report never stops the job
                    pass


def live_actuations(recorder: Recorder, out: TextIO) -> Callable[[Snapshot, Sequence[Event]], None]:
    """A hub listener printing each power-limit change as it happens (fan changes are only counted)."""
    seen = [0]

    def listener(snapshot: Snapshot, events: Sequence[Event]) -> None:
        new = recorder.actuations[seen[0]:]
        seen[0] = len(recorder.actuations)
        for a in new:
            if str(a["knob"]).endswith("/power_limit") or "/pl" in str(a["knob"]):
                out.write(report.actuation_line(a) + "\n")
        out.flush()

    return listener


@dataclass
class SimResult:
    """A finished simulation: the daemon's exit ``code``, the summary ``data`` (see :func:`print_summary`),
    where its files were (``places``; removed after a clean run) and, for programmatic use, the ``daemon``
    that ran (its hub, control and energy service as they were at the end)."""

    code: int
    data: dict[str, Any]
    places: Places
    daemon: Any = None


async def simulate(settings: Any, opts: SimOptions, out: TextIO | None, signals: Any = None) -> SimResult:
    """Run the daemon on a fresh simulated machine until ``opts.duration_s`` simulated seconds passed (or
    it is stopped), then print the summary to ``out`` (None: print nothing). ``signals``: a
    :class:`~aithermd.runtime.signals.Signals` caught earlier (default: SIGTERM/SIGINT handled when
    ``out`` is given)."""
    from aithermd.runtime.daemon import Daemon
    from aithermd.sim.budget_watch import BudgetWatch
    from aithermd.sim.machine import DEFAULT_PROFILES, SimulatedMachine

    profiles = list(opts.profiles) if opts.profiles is not None else machine_profiles(opts.gpu_profiles,
                                                                                        opts.gpus)
    workload = make_workload(opts, len(profiles) if profiles is not None else len(DEFAULT_PROFILES))
    places = make_places(opts.state_dir)
    if opts.calibrate_fans:  # on a twin of the machine, unless fans.json is there already
        calibrate_twin(places.state_dir, seed=opts.seed)
    clock = SimClock(wall_start=opts.wall_start)
    machine = SimulatedMachine(places.machine_dir, profiles=profiles, workload=workload, seed=opts.seed,
                               wall_start=clock.wall(), fan_dies=opts.fan_dies)
    fault_io, plan = None, None
    if opts.faults:
        from aithermd.sim.faults import FaultIO, FaultPlan

        fault_io = FaultIO()
        try:
            plan = FaultPlan(opts.faults, machine.nvml, fault_io, str(machine.sysfs_root))
        except ValueError:
            machine.close()
            cleanup(places)
            raise
    recorder = Recorder(t0=clock.monotonic())
    out = report.Output(out, on_gone=lambda: daemon.request_stop()) if out is not None else None
    live = None if opts.json_summary else out
    settings = settings.replace(**{"state_dir": places.state_dir, "sysfs_root": machine.sysfs_root})
    def report_progress(gpus: list[str], rate: float) -> None:
        if daemon.control is not None:
            daemon.control.report_progress(gpus, rate)

    daemon = Daemon(settings, clock=clock, backends=build_backends(machine, clock, fault_io),
                    sleep=sim_sleep(clock, opts.speedup),
                    before_sample=Stepper(machine, clock.monotonic(), live, faults=plan,
                                          max_step_s=opts.max_step_s,
                                          report=report_progress if opts.progress else None),
                    processes=machine.processes.process_table())
    if opts.on_daemon is not None:
        opts.on_daemon(daemon, machine)
    daemon.hub.add_listener(recorder)
    watch = BudgetWatch(machine)
    daemon.hub.add_listener(watch)
    for listener in opts.listeners:
        daemon.hub.add_listener(listener)
    if live is not None:
        daemon.hub.add_listener(live_actuations(recorder, live))
    duration = opts.duration_s
    until = (lambda: machine.t_s >= duration) if duration is not None else None
    code, data = 1, {}
    try:
        handle = signals if signals is not None else out is not None
        code = await daemon.run(until=until, handle_signals=handle)
    finally:
        if daemon.tick is not None:
            policy = daemon.control.active if daemon.control else settings.policy
            data = summary_data(machine, recorder, policy)
            if settings.dry_run:
                data["dry_run"] = True
            if daemon.not_restored:
                data["not_restored"] = dict(daemon.not_restored)
            if plan is not None:
                data["faults"] = [{"t_s": t, "fault": what, "spec": spec} for t, what, spec in plan.log]
                report.leave_out_lost(data)
            if watch.ticks:
                data["budget"] = watch.summary()
            if out is not None:
                text = json.dumps(data, indent=1) + "\n" if opts.json_summary else report.format_summary(data)
                out.write(text)
                out.flush()
        machine.close()
        if code == 0 or (daemon.tick is None and opts.state_dir is None):  # no tick: nothing was written
            cleanup(places)
    return SimResult(code, data, places, daemon)


def run_simulated(settings: Any, args: Any, out: TextIO | None = None, signals: Any = None) -> int:
    """``aithermd run --simulate``: exit 0 after a clean run, 1 when the daemon failed or the trace's content
    is malformed (its file:line), 2 for bad input (an unreadable trace or dump, a bad flag), each with one line
    on stderr saying what to do."""
    import sys

    from aithermd.policy.trace import TraceError, span_text
    from aithermd.sim.smi_dump import DumpError

    out = out or sys.stdout
    try:
        opts = options_from_args(args)
        load = make_workload(opts) if opts.trace is not None else None  # fail before anything starts
        machine_profiles(opts.gpu_profiles, opts.gpus)
    except DumpError as exc:  # its text is FILE[:LINE]: error: message
        print(f"aithermd run --simulate: --gpu-profile {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the trace: missing, unreadable, not a regular file
        why = (exc.strerror or str(exc)).lower()
        print(f"aithermd run --simulate: --trace {exc.filename or getattr(args, 'sim_trace', '')}: error: cannot "
              f"read: {why} (give the CSV file that `nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw "
              "--format=csv -l 1` wrote)", file=sys.stderr)
        return 2
    except TraceError as exc:  # invalid trace content: 1, as `aithermd replay` says of the same file
        print(f"aithermd run --simulate: malformed trace: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"aithermd run --simulate: error: {exc}", file=sys.stderr)
        return 2
    for gap in getattr(load, "gaps", ()):
        print(f"aithermd run --simulate: warning: {opts.trace}:{gap['line']}: {span_text(gap['seconds'])} "
              f"since the sample of line {gap['after_line']}: the log stopped; the simulated GPUs hold that "
              "sample's load for the whole gap", file=sys.stderr)
    for line in report.faults_too_late(opts.faults, opts.duration_s):
        print(f"aithermd run --simulate: warning: {line}", file=sys.stderr)
    update: dict[str, Any] = {}
    if getattr(args, "bus", None) is None:
        update["bus"] = "none"  # a simulation serves no bus unless asked to
    if getattr(args, "metrics_listen", None) is None:
        update["metrics_listen"] = "none"
    try:
        result = asyncio.run(simulate(settings.replace(**update), opts, out, signals))
    except ValueError as exc:  # a --fault naming what the simulated machine does not have
        print(f"aithermd run --simulate: error: {exc}", file=sys.stderr)
        return 2
    if result.code != 0 and result.places.state_dir.exists():
        why = report.exit_reason(result.data)
        print(f"aithermd run --simulate: the daemon stopped with {result.code}{why}; its files stay in "
              f"{result.places.state_dir} and {result.places.machine_dir}", file=sys.stderr)
    elif result.code != 0:
        print(f"aithermd run --simulate: the daemon stopped with {result.code} before its first tick "
              "(see the error above); nothing was written", file=sys.stderr)
    return result.code
