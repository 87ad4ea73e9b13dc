"""``aithermd`` command line: one module per subcommand under :mod:`aithermd.commands`.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; it is
imported only when chosen, so ``aithermd --help`` stays fast. Exit codes: 0 success, 1 failure or invalid
input, 2 usage error or unreadable file.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import sys

from aithermd import __version__

COMMANDS: dict[str, str] = {
    "run": "run the daemon (the control loop)",
    "restore": "put every journaled knob back to what was found, then clear the journal",
    "sensors": "discover and read every device once, like lm-sensors",
    "fans": "find which fan follows which pwm (detect), measure start/stop duty (calibrate), show them",
    "check": "validate policy files",
    "schema": "print the JSON Schema of policy files",
    "replay": "run the policy engine over a recorded nvidia-smi trace",
}


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aithermd", description="Thermal and power management daemon for Linux AI workstations.")
    parser.add_argument("--version", action="version", version=f"aithermd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load:
            importlib.import_module(f"aithermd.commands.{name}").add_arguments(p)
    return parser


NEGATIVE = re.compile(r"-\.?\d")  # "-5m", "-0.5": a value, since no option of aithermd starts with a digit


def join_negative_values(argv: list[str]) -> list[str]:
    """``--opt -5m`` → ``--opt=-5m``: argparse takes a token that starts with ``-`` and is not a plain number
    for an option and answers "expected one argument"; joined, the option's own check words the error."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":  # what follows is not aithermd's
            return out + argv[i:]
        if out and NEGATIVE.match(arg) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "run" and gc.isenabled():
        # the daemon's start-up: no cyclic-garbage passes over the objects its imports and discovery build
        # (~80 passes, ~6 % of its CPU to READY=1, issue 22); the daemon turns the collector back on after
        # its first tick (Daemon._run_tick), and so does this function if it returns before that
        gc.disable()
        try:
            return _main(argv, command)
        finally:
            gc.enable()
    return _main(argv, command)


def _main(argv: list[str], command: str | None) -> int:
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    module = importlib.import_module(f"aithermd.commands.{args.command}")
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
