"""``aithermd check FILE...``: validate policy files; nothing is applied.

Each problem is printed on stderr as ``FILE:LINE:COL: error: KEY: message (hint: ...)``; each valid file as
``FILE: ok`` on stdout. With ``--sysfs-root DIR`` or ``--simulate`` device references (GPU indexes, fans,
zones, sensors) are also checked against that machine: one written exactly (no wildcard) that names nothing
there is an error naming what the machine has; what the daemon would warn about there is said as
``FILE:LINE:COL: warning: ...`` (a fan rule that selects no fan, a power limit clamped to the devices'
constraints, fans whose curve finds no sensor, a curve source's pattern that matches no sensor there: a
required one sends the curve's fans to full); warnings leave the exit status alone. Permission problems
are only warnings here (the daemon running as root refuses them).

Exit status: 0 all valid, 1 any invalid, 2 usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from aithermd import log
from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import nonempty_arg
from aithermd.model import Device

HELP = "validate policy files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=nonempty_arg, metavar="FILE", help="policy files (YAML)")
    machine = parser.add_mutually_exclusive_group()
    machine.add_argument("--sysfs-root", type=nonempty_arg, metavar="DIR",
                         help="also check device references against this sysfs tree")
    machine.add_argument("--simulate", action="store_true",
                         help="also check device references against the simulated workstation")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing for valid files")


def machine_devices(args: argparse.Namespace) -> list[Device] | None:
    """The devices of the machine the arguments name, or None. Raises OSError/RuntimeError when unusable."""
    from aithermd.backends.registry import discover, open_backends
    if args.sysfs_root:
        if not os.path.isdir(args.sysfs_root):
            raise OSError(f"{args.sysfs_root}: not a directory")
        if not any(os.path.isdir(os.path.join(args.sysfs_root, "class", c))
                   for c in ("hwmon", "powercap", "thermal")):
            raise OSError(f"{args.sysfs_root}: not a sysfs tree (no class/hwmon or class/powercap in it; "
                          "give a machine's sys/ directory)")
        backends = open_backends(args.sysfs_root, cpu=False)
        try:
            return list(discover(backends).devices)
        finally:
            for b in backends:
                b.close()
    if args.simulate:
        from aithermd.sim.machine import SimulatedMachine
        from aithermd.sim.runner import SimClock, build_backends
        with tempfile.TemporaryDirectory(prefix="aithermd-check-") as tmp:
            machine = SimulatedMachine(Path(tmp) / "machine")
            backends = build_backends(machine, SimClock())
            try:
                return list(discover(backends).devices)
            finally:
                for b in backends:
                    b.close()
                machine.close()
    return None


def run(args: argparse.Namespace) -> int:
    log.setup(level="error")
    from aithermd.policy.devicecheck import check_devices, curve_warnings, device_warnings, unsourced_fans
    from aithermd.policy.loader import load_policy_file, permission_problems, shipped_policy_dir
    from aithermd.runtime.changes import unsourced_message

    try:
        devices = machine_devices(args)
    except Exception as exc:  # noqa: BLE001 - any failure to build the machine is a usage problem here
        print(f"aithermd check: cannot use that machine: {exc}", file=sys.stderr)
        return 2
    status = 0
    for name in args.files:
        path = Path(name)
        if not path.is_file() or not os.access(path, os.R_OK):
            why = "no such file" if not path.exists() else "not a regular file" if not path.is_file() \
                else "permission denied"
            print(f"{name}: error: cannot read: {why}", file=sys.stderr)
            status = 2
            continue
        for problem in permission_problems(path) + permission_problems(path.parent):
            print(f"{name}: warning: {problem} (the daemon running as root refuses it)", file=sys.stderr)
        warnings: list[str] = []
        try:
            policy = load_policy_file(path)
            errors: list[PolicyError] = check_devices(policy, devices) if devices is not None else []
            warnings = [w.format("warning") for w in curve_warnings(policy)]
            doc = policy.document
            if not doc.rules and doc.budget is None and doc.quiet is None:  # valid, and does nothing
                warnings.append(f"{name}: warning: no rules: this policy sets no knob (each keeps what aithermd "
                                f"found at start); add rules (examples: {shipped_policy_dir()})")
            if devices is not None:
                warnings += [w.format("warning") for w in device_warnings(policy, devices)] + [
                    f"{name}: warning: {unsourced_message(policy.name, *u)}"
                    for u in unsourced_fans(policy, devices)]
        except PolicyErrors as exc:
            errors = exc.errors
        for err in errors:
            print(err.format(), file=sys.stderr)
        for line in warnings:
            print(line, file=sys.stderr)
        if errors:
            status = max(status, 1)
        elif not args.quiet:
            print(f"{name}: ok")
    return status
