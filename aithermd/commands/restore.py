"""``aithermd restore``: put every journaled knob back to what was found, then clear the journal.

For ``ExecStopPost=`` and after a crash: needs nothing but the state directory, whose journal names each
knob's backend and root. Idempotent. A knob its backend no longer knows (its device is absent) is not a
failure: a warning, and it stays journaled until its device is back, or is forgotten when it was recorded
before the last reboot (:mod:`aithermd.actuate.restore`). Refuses while a daemon runs on the state
directory (it restores on its own when it stops). Exit codes: 0 every present knob restored (or nothing to do:
also a state directory that does not exist, said on stderr; ``ExecStopPost=`` runs this after a daemon that
never started); a fan left at full duty or in its driver's automatic mode instead of as found is a warning), 1
some knob could not be restored (it stays journaled; the log says why) or a daemon runs, 2 the journal cannot
be read, or ``--sysfs-root`` is no sysfs tree (said up front: every knob would be unknown there). A journal that is no journal (torn, garbage: attack6 G1) is moved aside to
``journal.json.corrupt-TIME`` and every fan found in manual mode at a low duty is handed to its driver's
automatic mode, since its original is lost and nothing else would drive it (exit 2 still: a person looks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aithermd.files import path_arg

PREFIX = "aithermd restore: "  # every line on stderr, as the other commands say theirs
HELP = "put every journaled knob back to what was found, then clear the journal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=path_arg, metavar="DIR",
                        help="state directory holding the journal "
                        "(default: the config's, else /var/lib/aithermd)")
    parser.add_argument("--sysfs-root", type=path_arg, metavar="DIR",
                        help="use this sysfs root instead of the one each journal entry names")
    parser.add_argument("--config", type=path_arg, metavar="FILE", help="settings file, for its state_dir")


def _settings(args: argparse.Namespace) -> tuple[Path, Path]:
    """The state directory (``--state-dir``, else the config's) and the config's sysfs root (the daemon's
    own: entries journaled there are applied whoever owns it, :mod:`aithermd.actuate.locators`)."""
    from aithermd.errors import PolicyErrors
    from aithermd.settings import DEFAULT_STATE_DIR, DaemonSettings, load_settings
    try:
        settings = load_settings(args.config)
    except PolicyErrors as exc:  # restore must work even with a broken config
        if args.state_dir is None:
            print(f"{PREFIX}warning: {exc}; using the default state directory", file=sys.stderr)
        return args.state_dir or DEFAULT_STATE_DIR, DaemonSettings().sysfs_root
    return args.state_dir or settings.state_dir, settings.sysfs_root


def _make_fans_safe(args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    """The journal's originals are lost: every fan found in manual mode at a low duty goes to its driver's
    automatic mode (:func:`aithermd.actuate.restore.make_fans_safe`), on the daemon's backends. Returns the
    sysfs root made safe (``--sysfs-root``, else the config's: the lost journal was the only record of a
    root given to the daemon on its command line; attack13 A6) and knob id → what was done."""
    from aithermd.actuate.restore import make_fans_safe
    from aithermd.backends.registry import discover, open_for_daemon
    from aithermd.errors import PolicyErrors
    from aithermd.settings import DaemonSettings, load_settings
    try:
        settings = load_settings(args.config)
    except PolicyErrors:
        settings = DaemonSettings()
    if args.sysfs_root is not None:
        settings = settings.replace(sysfs_root=args.sysfs_root)
    backends = open_for_daemon(settings)
    try:
        inventory = discover(backends)
        return settings.sysfs_root, make_fans_safe(inventory.owner, inventory.knobs.values())
    finally:
        for backend in backends:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def run(args: argparse.Namespace) -> int:
    from aithermd import log
    from aithermd.actuate.journal import Journal, JournalError
    from aithermd.actuate.restore import restore_journal
    from aithermd.runtime.instance import held_by_other

    log.setup("info", "auto")
    state_dir, own_root = _settings(args)
    if state_dir.exists() and not state_dir.is_dir():  # a typo in ExecStopPost= must not pass for success
        print(f"{PREFIX}error: {state_dir}: not a directory (give the --state-dir the daemon "
              "ran with)", file=sys.stderr)
        return 2
    if not state_dir.is_dir():  # exit 0 still: ExecStopPost= runs this after a daemon that never started
        print(f"{PREFIX}warning: {state_dir}: no such state directory, so nothing to restore "
              "(give the --state-dir the daemon ran with)", file=sys.stderr)
        return 0
    if args.sysfs_root is not None and not (args.sysfs_root / "class").is_dir():  # every knob unknown
        print(f"{PREFIX}error: {args.sysfs_root}: not a sysfs tree (no class/ directory); give "
              "the root the daemon ran on, or leave --sysfs-root out; nothing restored", file=sys.stderr)
        return 2
    owner = held_by_other(state_dir)
    if owner is not None:
        print(f"{PREFIX}error: {owner} is running on {state_dir}: it restores every knob when it stops "
              "(systemctl stop aithermd); nothing restored", file=sys.stderr)
        return 1
    try:
        journal = Journal(state_dir, quarantine=True)
    except JournalError as exc:
        print(f"{PREFIX}error: {exc}", file=sys.stderr)
        return 2
    if journal.lost is not None:
        print(f"{PREFIX}error: {journal.lost}", file=sys.stderr)
        root, notes = _make_fans_safe(args)
        for note in notes.values():
            print(f"{PREFIX}warning: {note}", file=sys.stderr)
        print(f"{PREFIX}made safe under {root} ({len(notes)} knob(s) changed); a daemon that ran on another "
              "root: run again with --sysfs-root DIR", file=sys.stderr)
        return 2
    if not journal.dirty:
        print(f"nothing to restore in {state_dir}")
        return 0
    try:
        report = restore_journal(journal, sysfs_root=args.sysfs_root, own_root=own_root)
    except JournalError as exc:
        print(f"{PREFIX}error: {exc}", file=sys.stderr)
        return 1
    print(f"restored {len(report.restored)} knob(s) from {state_dir}")
    for knob_id, why in {**report.absent, **report.forgotten}.items():
        print(f"{PREFIX}warning: {knob_id}: {why}", file=sys.stderr)
    for why in report.fallbacks.values():
        print(f"{PREFIX}warning: {why}", file=sys.stderr)
    for knob_id, why in report.failed.items():
        print(f"{PREFIX}error: {knob_id}: {why}", file=sys.stderr)
    sys.stdout.flush()  # now: a restore left hung in a driver holds the exit (actuate.restore_devices)
    return 0 if report.ok else 1
