"""The ``--simulate`` flags of ``aithermd run`` and what they ask for (:class:`SimOptions`), for
:mod:`aithermd.sim.runner`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aithermd.files import path_arg
from aithermd.model import Event, Snapshot

if TYPE_CHECKING:
    from aithermd.sim.workload import Workload

MAX_STEP_S = 1.0  # physics substep: ticks longer than this are integrated in pieces


@dataclass
class SimOptions:
    """What ``--simulate`` was asked: ``duration_s`` (None = until stopped), ``speedup`` (0 = no
    waiting), ``trace`` (nvidia-smi CSV), ``gpu_profiles`` (dumps added to the default GPUs … or replacing
    them, see :func:`machine_profiles`), ``seed``, ``state_dir`` (None = temporary)."""

    duration_s: float | None = None
    speedup: float = 1.0
    trace: Path | None = None
    gpu_profiles: Sequence[Path] = ()
    seed: int = 0
    state_dir: Path | None = None
    json_summary: bool = False
    cycle: tuple[float, float, float] | None = None  # idle before, busy, idle after (s); None: 120, 360, 120
    busy_kind: str = "training"  # the busy phase's jobs: training or decode (memory-bound)
    held_idle: bool = False  # idle cards are held high (a process keeps them at P0)
    progress: bool = False  # busy jobs report their progress rate, as aithermctl run --progress-regex does
    wall_start: float | None = None  # simulated wall clock at the start (None: now); schedules follow it
    workload: Workload | None = None  # programmatic use: replaces trace/cycle
    profiles: Sequence[Any] | None = None  # programmatic use: GpuProfiles instead of dumps or the default
    # programmatic use: more hub listeners, called with each published snapshot and its events
    listeners: Sequence[Callable[[Snapshot, Sequence[Event]], None]] = ()
    faults: Sequence[Any] = ()  # --fault: parsed :class:`~aithermd.sim.faults.Fault` specs
    max_step_s: float = MAX_STEP_S  # the physics' substep (s)
    on_daemon: Callable[[Any, Any], None] | None = None  # programmatic use: told (daemon, machine) first
    stagger_s: float | None = None  # GPU i's workload starts i × stagger_s later (phase-shifted jobs)
    gpus: int | None = None  # simulate this many GPUs: the first of the profiles, repeated when fewer
    calibrate_fans: bool = False  # detect and calibrate the fans first (on a twin), unless fans.json exists
    fan_dies: Mapping[str, float] | None = None  # board tach → simulated second its fan seizes


def add_arguments(parser: Any) -> None:
    """The ``--simulate`` flags of ``aithermd run``."""
    group = parser.add_argument_group("simulated workstation (--simulate)")
    group.add_argument("--simulate", action="store_true",
                       help="run on a simulated workstation (real daemon, simulated GPUs and board)")
    group.add_argument("--duration", dest="sim_duration_s", type=_duration, metavar="S",
                       help="stop after S simulated seconds (600, 600s, 10m, 1h30m) and print a summary (default: until stopped)")
    group.add_argument("--speedup", dest="sim_speedup", type=float, default=1.0, metavar="K",
                       help="simulated time runs K times faster than wall time (0: as fast as possible)")
    group.add_argument("--trace", dest="sim_trace", type=path_arg, metavar="FILE",
                       help="GPU utilization from an nvidia-smi --query-gpu CSV log instead of the default "
                            "idle → training → idle cycle")
    group.add_argument("--gpu-profile", dest="sim_gpu_profiles", action="append", type=path_arg, default=[],
                       metavar="DUMP", help="simulate the GPUs of this nvidia-smi -q dump instead of the "
                                            "default RTX 4090 + RTX 6000 Ada (repeatable)")
    group.add_argument("--gpus", dest="sim_gpus", type=int, metavar="N",
                       help="simulate N GPUs: the first N of the --gpu-profile dumps (or of the default "
                            "pair), repeated when there are fewer")
    group.add_argument("--stagger", dest="sim_stagger_s", type=_duration, metavar="S",
                       help="phase-shifted jobs: GPU i runs the workload i × S seconds after GPU 0")
    group.add_argument("--cycle", dest="sim_cycle", type=_cycle, metavar="BEFORE,BUSY,AFTER",
                       help="the default cycle's phases: idle, busy, idle, each in seconds or like 2m (default "
                            "120,360,120)")
    group.add_argument("--busy", dest="sim_busy", choices=("training", "decode"), default="training",
                       help="the busy phase's jobs: training, or memory-bound LLM decode (default training)")
    group.add_argument("--held-idle", dest="sim_held_idle", action="store_true",
                       help="idle GPUs are held high (a process keeps them in P0), as some drivers do")
    group.add_argument("--progress", dest="sim_progress", action="store_true",
                       help="the simulated jobs report their progress rate to the daemon, as aithermctl run "
                            "--progress-regex does: the efficient search's exact signal")
    group.add_argument("--seed", dest="sim_seed", type=int, default=0, help="noise seed (default 0)")
    group.add_argument("--calibrate-fans", dest="sim_calibrate_fans", action="store_true",
                       help="detect and calibrate the board's fans first, on a twin (unless in fans.json)")
    group.add_argument("--summary-json", dest="sim_json", action="store_true",
                       help="print the summary as one JSON document (and no progress lines)")
    group.add_argument("--fault", dest="sim_faults", action="append", default=[], metavar="SPEC",
                       help="inject a fault, TARGET:FAULT@WHEN (gpu1:GPU_IS_LOST@120s, gpu0:UNKNOWN@60s-90s, "
                            "hwmon:nct6798-isa-0290/temp2:EIO@30s; see docs/faults.md; repeatable)")


def _duration(text: str) -> float:
    from aithermd.sim.faults import seconds

    try:
        return seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cycle(text: str) -> tuple[float, float, float]:
    from aithermd.sim.faults import seconds

    try:
        parts = tuple(seconds(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or parts[1] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give three durations BEFORE,BUSY,AFTER, e.g. 120,1320,120 "
                                         "or 2m,22m,2m")
    return parts  # type: ignore[return-value]


def options_from_args(args: Any) -> SimOptions:
    """SimOptions from ``aithermd run`` arguments. Raises ValueError for a negative speedup or duration, or
    a ``--fault`` spec that does not parse."""
    from aithermd.sim.faults import parse_all

    duration, speedup = args.sim_duration_s, args.sim_speedup
    if duration is not None and not 0 < duration < math.inf:  # also refuses nan
        raise ValueError(f"--duration must be a finite number > 0 s, not {duration:g}")
    if not 0 <= speedup < math.inf:
        raise ValueError(f"--speedup must be a finite number >= 0, not {speedup:g}")
    cycle, busy, held = getattr(args, "sim_cycle", None), getattr(args, "sim_busy", "training"), \
        getattr(args, "sim_held_idle", False)
    if args.sim_trace is not None and (cycle is not None or busy != "training" or held):
        raise ValueError("--cycle, --busy and --held-idle shape the default cycle: not with --trace")
    if (stagger := getattr(args, "sim_stagger_s", None)) is not None and not 0 <= stagger < math.inf:
        raise ValueError(f"--stagger must be a finite number of seconds >= 0, not {stagger:g}")
    return SimOptions(duration_s=duration, speedup=speedup, trace=args.sim_trace,
                      gpu_profiles=tuple(args.sim_gpu_profiles), seed=args.sim_seed,
                      state_dir=args.state_dir, json_summary=args.sim_json, stagger_s=stagger,
                      gpus=getattr(args, "sim_gpus", None), cycle=cycle, busy_kind=busy, held_idle=held,
                      progress=bool(getattr(args, "sim_progress", False)),
                      calibrate_fans=bool(getattr(args, "sim_calibrate_fans", False)),
                      faults=tuple(parse_all(getattr(args, "sim_faults", None) or ())))
