"""``aithermd sensors``: discover every device and read it once, like lm-sensors.

RAPL power and CPU utilization are rates, so the command samples every backend twice, ``--interval``
seconds apart (default 0.2 s), and prints the second sample (a reading missing from it falls back to the
first). ``--interval 0`` reads once: RAPL power and CPU utilization then read ``stale``. With
``--sysfs-root`` the tree is a recorded or mocked machine, so the live CPU (psutil reads ``/proc``) is left
out; without it the CPU is included. With ``--json`` stdout holds exactly one document
(:func:`aithermd.publish.sensors.sensors_document`); logs and warnings always go to stderr. Each channel
shows its status and, when not ok, the reason (the errno, the sentinel, the range it left); the two reads
go through the daemon's sensor trust, so a transient fault after a good read shows as ``held``.

GPUs: the live NVML without ``--sysfs-root`` (zero GPUs without a driver); ``--gpu-profile DUMP``
(repeatable) adds fake GPUs built from ``nvidia-smi -q`` dumps (text or XML), numbered after the real ones.

Exit status: 0 success, 2 when ``--sysfs-root`` is not a sysfs tree (no ``class/hwmon`` or
``class/powercap``), ``--interval`` is not 0–60 s, or a ``--gpu-profile`` dump is unreadable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from aithermd import log
from aithermd.backends.base import Backend
from aithermd.backends.registry import discover, open_backends
from aithermd.backends.trust import SensorTrust
from aithermd.errors import AithermError
from aithermd.files import nonempty_arg
from aithermd.model import KnobValue, Reading
from aithermd.publish.sensors import render_table, sensors_document

HELP = "discover and read every device once, like lm-sensors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", type=nonempty_arg, metavar="DIR", default=None,
                        help="read this sysfs tree instead of the live one (a recorded machine's sys/)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--interval", type=float, default=0.2, metavar="S",
                        help="seconds between the two samples that rates (RAPL power, CPU %%) need; "
                             "0: one sample")
    parser.add_argument("--gpu-profile", metavar="DUMP", action="append", default=[],
                        help="add fake GPUs from an `nvidia-smi -q` dump (text or -x XML); repeatable")


def open_for(args: argparse.Namespace) -> list[Backend]:
    """The backends these arguments ask for (GPU options extend this)."""
    from aithermd.backends.nvml import gpu_backends
    gpus = gpu_backends(live=args.sysfs_root is None, dumps=getattr(args, "gpu_profile", None) or ())
    if args.sysfs_root is None:
        return [*open_backends(), *gpus]
    return [*open_backends(args.sysfs_root, cpu=False), *gpus]


def read_document(backends: list[Backend], interval: float,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Discover, sample (twice, ``interval`` apart, when ``interval`` > 0) and build the document. Each
    round goes through the daemon's sensor trust, so the second shows what the daemon would conclude: a
    transient fault after a good first read is ``held``, a persistent one ``failed``, each with its reason."""
    devices = list(discover(backends).devices)
    readings: dict[str, Reading] = {}
    knobs: dict[str, KnobValue] = {}
    logger = log.get("aithermd.sensors")
    trust = SensorTrust()
    trust.configure(devices)
    rounds = 2 if interval > 0 else 1
    for n in range(rounds):
        if n:
            sleep(interval)
        fresh: dict[str, Reading] = {}
        for backend in backends:
            try:
                sample = backend.sample()
            except Exception as exc:  # noqa: BLE001 - one backend's failure must not blank the others
                logger.warning("sample failed", backend=getattr(backend, "kind", "?"), error=str(exc))
                continue
            fresh.update(sample.readings)
            knobs.update(sample.knobs)
        readings.update(trust.filter(time.monotonic(), fresh))
    return sensors_document(devices, readings, knobs)


def run(args: argparse.Namespace) -> int:
    log.setup(level="warning")
    if args.sysfs_root is not None and not os.path.isdir(args.sysfs_root):
        print(f"aithermd sensors: {args.sysfs_root}: not a directory (give a sysfs tree, e.g. a machine's "
              "sys/)", file=sys.stderr)
        return 2
    if args.sysfs_root is not None and not any(os.path.isdir(os.path.join(args.sysfs_root, "class", c))
                                               for c in ("hwmon", "powercap", "thermal")):
        print(f"aithermd sensors: {args.sysfs_root}: not a sysfs tree (no class/hwmon or class/powercap in "
              "it; give a machine's sys/ directory)", file=sys.stderr)
        return 2
    if not 0 <= args.interval <= 60:  # also refuses nan; inf crashed time.sleep
        print(f"aithermd sensors: --interval {args.interval:g}: give seconds from 0 to 60", file=sys.stderr)
        return 2
    try:
        backends = open_for(args)
    except AithermError as exc:
        print(f"aithermd sensors: {exc}", file=sys.stderr)
        return 2
    try:
        doc = read_document(backends, args.interval)
    finally:
        for backend in backends:
            backend.close()
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render_table(doc))
    return 0
