"""``aithermd`` command line: one module per subcommand under :mod:`aithermd.commands`.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; it is
imported only when chosen, so ``aithermd --help`` stays fast. Exit codes: 0 success, 1 failure or invalid
input, 2 usage error or unreadable file.
"""

from __future__ import annotations

import argparse
import importlib
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
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
