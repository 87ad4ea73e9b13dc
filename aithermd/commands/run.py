"""``aithermd run``: the daemon. Flags override the config file (``/etc/aithermd/aithermd.yaml``).

Exit codes: 0 clean stop (every journaled knob restored); 1 a knob that could not be restored, or a failure
at run time; 2 a usage error (a bad flag, a ``--policy`` no policy directory holds, a ``--policy-dir`` that
is not a directory; with ``--simulate``, a ``--policy FILE`` that does not load, each error at its
FILE:LINE:COL); 78 (EX_CONFIG) a configuration it cannot start with: invalid settings or policies, an
unreadable config file, a policy directory it names that does not exist, a sysfs root that is not a
directory, a state directory it cannot write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import aithermd.log  # noqa: F401 - first, so structlog is imported without rich (see aithermd.log)
from aithermd.files import nonempty_arg, path_arg

HELP = "run the daemon (the control loop)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=path_arg, metavar="FILE",
                        help="settings file (default /etc/aithermd/aithermd.yaml when it exists)")
    parser.add_argument("--policy", type=nonempty_arg, metavar="NAME|FILE",
                        help="the active policy (a name, or a policy file); wins over the choice kept in the "
                             "state directory")
    parser.add_argument("--policy-dir", dest="policy_dirs", action="append", type=path_arg, metavar="DIR",
                        help="another policy directory, after the shipped and admin ones (repeatable)")
    parser.add_argument("--state-dir", type=path_arg, metavar="DIR",
                        help="journal, kept policy and overrides (default /var/lib/aithermd)")
    parser.add_argument("--sysfs-root", type=path_arg, metavar="DIR", help="sysfs tree to use (default /sys)")
    parser.add_argument("--tick", dest="tick_s", type=float, metavar="S",
                        help="control period in s (default 1)")
    parser.add_argument("--dry-run", action="store_true", default=None,
                        help="decide and log, write nothing")
    parser.add_argument("--bus", metavar="system|session|none|ADDRESS",
                        help="D-Bus to serve on (default system)")
    parser.add_argument("--metrics-listen", metavar="HOST:PORT|none",
                        help="Prometheus endpoint (default 127.0.0.1:8736)")
    parser.add_argument("--no-nvml", dest="nvml", action="store_false", default=None,
                        help="do not open NVIDIA GPUs")
    parser.add_argument("--log-format", choices=("auto", "json", "console"), help="default auto")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="default info")
    from aithermd.sim.options import add_arguments as add_simulate_arguments  # --simulate and its flags
    add_simulate_arguments(parser)


FLAGS = ("policy", "policy_dirs", "state_dir", "sysfs_root", "tick_s", "dry_run", "bus", "metrics_listen",
         "nvml", "log_format", "log_level")


def settings_from_args(args: argparse.Namespace) -> Any:
    """DaemonSettings from the config file and the flags. Raises PolicyErrors."""
    from aithermd.settings import load_settings
    flags = {name: getattr(args, name, None) for name in FLAGS}
    return load_settings(args.config, flags)


def run(args: argparse.Namespace) -> int:
    from aithermd.runtime.signals import Signals
    signals = Signals.catch()  # first thing: a stop during start-up ends the daemon cleanly (exit 0)
    try:
        return _run(args, signals)
    finally:
        signals.close()


def _run(args: argparse.Namespace, signals: Any) -> int:
    from aithermd import log
    from aithermd.errors import EXIT_CONFIG, PolicyErrors
    from aithermd.runtime.daemon import Daemon

    if getattr(args, "simulate", False):
        ignored = [flag for flag, given in (("--sysfs-root", args.sysfs_root is not None),
                                             ("--no-nvml", args.nvml is False)) if given]
        if ignored:  # they were ignored without a word: the simulated board and GPUs are always there
            print(f"aithermd run: {' and '.join(ignored)} cannot go with --simulate, which makes its own "
                  "board (sysfs tree) and GPUs (use --gpus N for fewer GPUs)", file=sys.stderr)
            return 2
    if args.config is not None and not args.config.is_file():
        why = "no such file" if not args.config.exists() else "not a regular file"
        print(f"{args.config}: error: cannot read the config file: {why}", file=sys.stderr)
        return EXIT_CONFIG
    for directory in getattr(args, "policy_dirs", None) or ():
        if not Path(directory).is_dir():
            why = "no such directory" if not Path(directory).exists() else "not a directory"
            print(f"aithermd run: --policy-dir {directory}: {why} (give a directory of policy .yaml files)",
                  file=sys.stderr)
            return 2
    if getattr(args, "policy", None) and _looks_like_a_file(args.policy):
        problem = _policy_from_file(args)
        if problem:
            print(f"aithermd run: --policy {args.policy}: {problem}", file=sys.stderr)
            return 2
    try:
        settings = settings_from_args(args)
    except PolicyErrors as exc:
        flags = [e for e in exc.errors if e.path.startswith("--")]
        for err in flags or exc.errors:  # a bad flag is a usage error: exit 2, in the project's words
            print(f"aithermd run: {err.path} {err.message}" if flags else err.format(), file=sys.stderr)
        return 2 if flags else EXIT_CONFIG
    missing = _missing_policy_dirs(args, settings)
    if missing:
        print(f"{missing[0]}: error: policy directory (policy_dirs in the configuration) does not exist "
              "(create it, or take it out of policy_dirs)", file=sys.stderr)
        return EXIT_CONFIG
    unknown = _unknown_policy(args, settings)
    if unknown:
        print(f"aithermd run: --policy {args.policy}: {unknown}", file=sys.stderr)
        return 2
    if not getattr(args, "simulate", False) and not settings.sysfs_root.is_dir():
        print(f"{settings.sysfs_root}: error: sysfs root is not a directory (give the root of a sysfs tree, "
              "e.g. /sys)", file=sys.stderr)
        return EXIT_CONFIG
    simulate = getattr(args, "simulate", False)
    if simulate and getattr(args, "policy_file", None) is not None:
        errors = _policy_file_errors(args.policy_file)
        if errors:
            print("\n".join(errors), file=sys.stderr)
            return 2
    # a simulated run writes its journal where --state-dir says (else in a temporary directory of its own)
    journal_dir = getattr(args, "state_dir", None) if simulate else None if settings.dry_run else settings.state_dir
    if journal_dir is not None:
        problem = _state_dir_problem(journal_dir)
        if problem:
            print(f"{journal_dir}: error: {problem}: the journal of every original setting lives there, "
                  "so nothing may be written without it (give a writable --state-dir DIR, or --dry-run)",
                  file=sys.stderr)
            return EXIT_CONFIG
    log.setup(settings.log_level, settings.log_format)
    if getattr(args, "simulate", False):
        from aithermd.sim.runner import run_simulated
        return run_simulated(settings, args, signals=signals)
    return asyncio.run(Daemon(settings).run(handle_signals=signals))


def _state_dir_problem(state_dir: Path) -> str | None:
    """Why the journal could not be written in ``state_dir`` (created if missing), or None."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create the state directory ({exc.strerror})"
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return "the state directory is not writable"
    return None


def _missing_policy_dirs(args: argparse.Namespace, settings: Any) -> list[Path]:
    """The policy directories the configuration (file or environment) names that are not directories;
    the defaults may be absent (no admin policies), the flags were checked before."""
    from aithermd.settings import default_policy_dirs
    known = {*map(Path, default_policy_dirs()), *map(Path, getattr(args, "policy_dirs", None) or ())}
    return [Path(d) for d in settings.policy_dirs or () if Path(d) not in known and not Path(d).is_dir()]


def _unknown_policy(args: argparse.Namespace, settings: Any) -> str | None:
    """Why ``--policy NAME`` names no policy in the policy directories (a usage error, found before anything
    starts: no simulated machine made, nothing written), or None."""
    if not getattr(args, "policy", None):
        return None
    from aithermd.policy.loader import policy_files
    from aithermd.runtime.world import policy_dirs

    files = policy_files(policy_dirs(settings))
    if settings.policy in files:
        return None
    return (f"no policy named '{settings.policy}' (known: {', '.join(sorted(files)) or 'none'}; "
            "or give a policy file's path)")


def _looks_like_a_file(policy: str) -> bool:
    return os.sep in policy or policy.endswith((".yaml", ".yml"))


def _policy_from_file(args: argparse.Namespace) -> str | None:
    """``--policy FILE`` (as ``aithermd replay --policy`` takes it): the file becomes the active policy,
    named by its stem. It goes last in the policy directories as itself (absolute, so a reload re-reads it
    wherever the daemon runs from; no other file beside it is loaded), so its errors name the user's file.
    Returns why the file cannot be used, or None; ``args.policy_file`` keeps the path as given."""
    path = Path(args.policy).expanduser()
    if not path.is_file():
        return "no such policy file (give a policy name, or the path of a .yaml file)"
    if path.suffix not in (".yaml", ".yml"):
        return "a policy file's name ends in .yaml"
    args.policy_file = path
    args.policy_dirs = [*(args.policy_dirs or []), Path(os.path.abspath(path))]
    args.policy = path.stem
    return None


def _policy_file_errors(path: Path) -> list[str]:
    """The errors of ``--policy FILE`` as ``aithermd check`` prints them (FILE:LINE:COL, the path as given),
    [] when it loads. A simulation checks it first: a file that cannot load at all is a usage error."""
    from aithermd.errors import PolicyErrors
    from aithermd.policy.loader import load_policy_file
    try:
        load_policy_file(path)
    except PolicyErrors as exc:
        return [err.format() for err in exc.errors]
    return []
