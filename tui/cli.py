"""``aithermctl``: the command line of aithermd; with no verb (or ``top``) the terminal UI.

Only argparse is imported up front so ``--help`` is instant; a verb imports what it needs (the D-Bus
client for most, Textual only for ``top`` and ``demo``). Every failure is one line on stderr with what to
do, and an exit code from :mod:`aithermd.publish.wire` (listed in ``--help``).
"""

from __future__ import annotations

import argparse
import re
import sys

from aithermctl import __version__

EPILOG = """\
DURATION is seconds or a number with s, m, h or d: 90, 90s, 15m, 2h.
The daemon must be running (systemctl start aithermd); reading needs no privileges, changing anything
needs root or polkit (actions io.github.aithermd.set-policy, .hold-policy, .override, .reload).

exit codes:
  0    success
  1    failure: the daemon could not do it (a policy file is invalid, a limit was reached, ...)
  2    usage error, or the daemon refused the arguments (unknown knob, policy or cookie; value out of range)
  3    aithermd is not running, or the bus cannot be reached
  4    not authorized (polkit or the bus policy refused)
  130  interrupted
  run and energy pass CMD's exit code through (128+N when signal N killed it, 127 when CMD is not found,
  126 when it cannot be executed)
"""


def _duration(text: str) -> float:
    from aithermctl.durations import parse_duration
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration_or_zero(text: str) -> float:
    """A DURATION, or 0 for none (a hold or override with no end, as the daemon's D-Bus API has it)."""
    if text.strip() in ("0", "0s", "none"):
        return 0.0
    return _duration(text)


_ADDRESS = re.compile(r"[A-Za-z][A-Za-z0-9-]*:([A-Za-z0-9_-]+=[^,;=]*(,[A-Za-z0-9_-]+=[^,;=]*)*)?")


def _bus(text: str) -> str:
    """``system``, ``session`` or a D-Bus address (``TRANSPORT:KEY=VALUE,...``, ``;`` between several, as
    the D-Bus specification writes them): a malformed one is a usage error, not an unreachable bus."""
    if text in ("system", "session") or (text and all(_ADDRESS.fullmatch(a) for a in text.split(";") if a)
                                         and text.strip(";")):
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not system, session or a D-Bus address "
        "(unix:path=/run/dbus/system_bus_socket, the one `aithermctl demo` prints)")


def _cookie(text: str) -> int:
    """A hold cookie: the D-Bus uint32 ``HoldPolicy`` returned."""
    try:
        cookie = int(text)
    except ValueError:
        cookie = -1
    if not 0 <= cookie <= 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"not a hold cookie: {text!r} (the number aithermctl hold printed; "
                                         "holds: aithermctl status)")
    return cookie


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aithermctl", description="Watch and steer aithermd. With no verb: the terminal UI.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"aithermctl {__version__}")
    parser.add_argument("--bus", default="system", type=_bus, metavar="system|session|ADDRESS",
                        help="where the daemon is (default: system)")
    parser.add_argument("--no-ask-password", action="store_true",
                        help="never let polkit ask for a password (scripts, job prologs): a change that "
                             "needs one is refused at once")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    p = sub.add_parser("status", help="devices, limits, fans and the policy in force")
    p.add_argument("--json", action="store_true", help="print exactly the daemon's GetSnapshot document")

    p = sub.add_parser("policy", help="list, show, activate or reload policies")
    psub = p.add_subparsers(dest="policy_verb", metavar="list|show|set|reload", required=True)
    pl = psub.add_parser("list", help="the loaded policies (* = active)")
    pl.add_argument("--json", action="store_true")
    psub.add_parser("show", help="a policy's file").add_argument("name", metavar="NAME")
    psub.add_parser("set", help="make NAME the active policy").add_argument("name", metavar="NAME")
    psub.add_parser("reload", help="reload policy files (all or nothing)")

    p = sub.add_parser("hold", help="hold a policy on top of the active one; prints the cookie")
    p.add_argument("policy", metavar="POLICY")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (shown to everyone)")
    p.add_argument("--timeout", type=_duration_or_zero, default=0.0, metavar="DURATION",
                   help="end the hold after DURATION (default 0: no end); without --detach, aithermctl "
                        "exits then (0, saying the hold expired)")
    p.add_argument("--detach", action="store_true",
                   help="keep the hold after aithermctl exits (release it with: aithermctl release COOKIE)")

    sub.add_parser("release", help="end a hold").add_argument("cookie", type=_cookie, metavar="COOKIE")

    p = sub.add_parser("run", help="hold POLICY while CMD runs, and/or report the progress CMD prints; "
                                   "CMD's exit code is passed through",
                       usage="aithermctl run [--policy POLICY] [--reason TEXT] [--progress-regex REGEX "
                             "[--progress-gpus GPUS]] -- CMD [ARGS...]")
    p.add_argument("--policy", default=None, metavar="POLICY")
    p.add_argument("--reason", default=None, metavar="TEXT", help="default: the command line")
    p.add_argument("--progress-regex", type=_regex, default=None, metavar="REGEX",
                   help="read CMD's progress from its output: a group (?P<rate>...) in steps/s (tqdm's "
                        "it/s), (?P<secs>...) in s/step, or a step counter (the first group); the rate feeds "
                        "the efficient-limit search of the GPUs CMD runs on")
    p.add_argument("--progress-gpus", default=None, metavar="GPUS",
                   help="the GPUs CMD runs on (gpu0,gpu1; default: CUDA_VISIBLE_DEVICES, else where its "
                        "processes are)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD")

    p = sub.add_parser("override", help="set a knob by hand, or clear that",
                       usage="aithermctl override KNOB VALUE [--for DURATION]\n"
                             "       aithermctl override clear KNOB")
    p.add_argument("words", nargs="+", metavar="KNOB VALUE | clear KNOB",
                   help="VALUE in the knob's unit: W for limits, %% for fans, MHz for a locked SM clock (250, "
                        "250W, 60%%, 1500MHz); for a power limit, N%% is N percent of its default, as in "
                        "policies")
    p.add_argument("--for", dest="seconds", type=_duration_or_zero, default=0.0, metavar="DURATION",
                   help="end the override after DURATION (default 0: until cleared)")

    p = sub.add_parser("gpu", help="let go of a GPU before unbinding or removing it")
    gsub = p.add_subparsers(dest="gpu_verb", metavar="release", required=True)
    gsub.add_parser("release", help="restore GPU's originals and stop using it until it is back"
                    ).add_argument("gpu", metavar="GPU")

    p = sub.add_parser("explain", help="why each knob has its value (one paragraph per knob)")
    p.add_argument("knob", nargs="?", default=None, type=_knob, metavar="KNOB")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("energy", help="joules per GPU and RAPL zone while CMD runs; the energy report",
                       usage="aithermctl energy [--json] -- CMD [ARGS...]\n"
                             "       aithermctl energy report [--since WHEN] "
                             "[--by unit|job|container|process|day] [--json]")
    p.add_argument("--json", action="store_true", help="print the StopEnergyWindow document")
    p.add_argument("--timeout", type=_duration, default=7 * 86400.0, metavar="DURATION",
                   help="the daemon ends the window after DURATION if aithermctl dies (default 7d)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD")

    p = sub.add_parser("fans", help="the fans: which pwm drives which, start/stop duty, alarms; detect, "
                       "calibrate (root, aithermd stopped)")
    p.add_argument("fans_verb", nargs="?", choices=("show", "detect", "calibrate"), default="show",
                   metavar="show|detect|calibrate")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="...",
                   help="detect/calibrate: the options of 'aithermd fans detect|calibrate' (--yes, --pwm, "
                        "--time-limit, --margin, --state-dir, --simulate)")

    p = sub.add_parser("doctor", help="what can be read and written here, and why not")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR", help=argparse.SUPPRESS)

    p = sub.add_parser("demo", help="a private bus, aithermd on the simulated workstation, and the TUI")
    p.add_argument("--policy", default=None, metavar="POLICY", help="policy for the simulated daemon")
    p.add_argument("--speedup", type=float, default=None, metavar="K",
                   help="simulated time runs K times faster")
    p.add_argument("--cycle", default="120,1800,120", metavar="BEFORE,BUSY,AFTER",
                   help="the simulated idle, training, idle phases (seconds or like 2m; default 120,1800,120: "
                        "a 30-minute job, long enough to watch the efficient search)")
    p.add_argument("--no-tui", action="store_true",
                   help="print the bus address and wait (for scripting: aithermctl --bus ADDRESS ...)")
    p.add_argument("--metrics-listen", default="127.0.0.1:8736", metavar="HOST:PORT|none",
                   help="Prometheus metrics of the simulated daemon (default 127.0.0.1:8736)")

    sub.add_parser("top", help="the terminal UI (the default)")
    return parser


def _command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error(f"{args.verb}: give the command after --, e.g. aithermctl {args.verb} "
                     + ("--policy ai-training " if args.verb == "run" else "") + "-- python train.py")
    args.command = cmd


def _regex(text: str) -> str:
    import re
    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None
    named = {"rate", "secs", "step"} & set(compiled.groupindex)
    if not named and compiled.groups == 0:
        raise argparse.ArgumentTypeError(f"{text!r} captures nothing: give a group, e.g. "
                                         r"'(?P<rate>[\d.]+)it/s' or 'step (\d+)'")
    return text


def _since(text: str) -> float:
    """WHEN for ``energy report --since``: a duration back from now (``7d``, ``24h``) or a local date
    (``2026-07-01``)."""
    import time

    from aithermctl.durations import parse_duration
    try:
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration or a date: {text!r} (examples: 7d, 24h, "
                                         "2026-07-01)") from None


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``energy report ...``: the report's own options, parsed from what followed ``report``."""
    p = argparse.ArgumentParser(prog="aithermctl energy report",
                                description="Energy per unit, Slurm job, container, command or day, from the "
                                            "history aithermd keeps (kWh, and cost where a price is set).")
    p.add_argument("--since", type=_since, default=None, metavar="WHEN",
                   help="a duration back from now (7d, 24h) or a date (2026-07-01); default 7d")
    p.add_argument("--by", choices=("unit", "job", "container", "process", "day"), default="unit")
    p.add_argument("--json", action="store_true", help="print the GetEnergyReport document")
    report = p.parse_args(args.command[1:])
    import time
    args.report, args.by = True, report.by
    args.since = report.since if report.since is not None else time.time() - 7 * 86400.0
    args.json = args.json or report.json


def _status(args: argparse.Namespace) -> int | None:
    """``status``: one blocking connection (:class:`aithermctl.calls.BlockingClient`), no event loop; None
    when the bus address needs the dbus-fast client."""
    from aithermctl import calls, errors

    try:
        with calls.BlockingClient(args.bus) as client:
            if args.json:
                text = client.call("GetSnapshot")  # exactly the daemon's document, byte for byte
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
                return 0
            doc = client.get_snapshot()
            known: dict[str, str | None] = {}
            for hold in (doc.get("policy") or {}).get("holds") or ():
                owner = str(hold.get("owner") or "")
                if hold.get("detached") or not owner.startswith(":"):
                    continue
                if owner not in known:
                    known[owner] = client.describe_owner(owner)
                if known[owner]:
                    hold["owner_text"] = known[owner]
    except calls.Unsupported:
        return None
    except errors.ClientError as exc:
        print(f"aithermctl: {exc}", file=sys.stderr)
        return exc.exit_code
    from aithermctl.render import status_text

    sys.stdout.write(status_text(doc))
    return 0


_NEGATIVE = re.compile(r"-\.?\d")  # "-5m", "-300W": a value (no option of aithermctl starts with a digit)
_VALUED = ("--for", "--timeout", "--reason")  # the options of hold and override that take a value


def _knob(text: str) -> str:
    """A knob id given on the command line: not empty (``explain ''`` explained every knob)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a knob id (gpu0/power_limit), or none for every "
                                         "knob")
    return text


def _negative_values(argv: list[str]) -> list[str]:
    """argparse takes a token like ``-5m`` or ``-300W`` for an option ("expected one argument",
    "unrecognized arguments"), so the value never reaches its own check. For ``hold`` and ``override`` only
    (they run no command of the user's, whose arguments must pass through untouched): each option is
    joined to its value (``--for=-5m``) and put first, then ``--`` and the words, when a word is negative."""
    verb = 0  # past the global options: --bus ADDRESS, --bus=ADDRESS, --no-ask-password
    while verb < len(argv) and argv[verb].startswith("--") and argv[verb] != "--":
        verb += 2 if argv[verb] == "--bus" else 1
    if verb >= len(argv) or argv[verb] not in ("hold", "override") or "--" in argv:
        return argv
    rest, opts, words = argv[verb + 1:], [], []
    while rest:
        arg = rest.pop(0)
        if arg in _VALUED and rest:
            opts.append(f"{arg}={rest.pop(0)}")
        elif arg.startswith("-") and not _NEGATIVE.match(arg):
            opts.append(arg)
        else:
            words.append(arg)
    dashes = ["--"] if any(_NEGATIVE.match(w) for w in words) else []
    return [*argv[:verb + 1], *opts, *dashes, *words]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_negative_values(list(sys.argv[1:] if argv is None else argv)))
    verb = args.verb or "top"
    if verb == "energy" and args.command[:1] == ["report"]:
        _report(args, parser)
    elif verb in ("run", "energy"):
        _command(args, parser)
    if verb == "run" and args.policy is None and args.progress_regex is None:
        parser.error("run: give --policy POLICY, --progress-regex REGEX, or both")
    if verb == "override":
        if len(args.words) != 2:  # KNOB VALUE or clear KNOB (knob ids always hold a "/")
            parser.error("override: give KNOB VALUE, or clear KNOB")
    try:
        if verb == "top":
            from aithermctl.tui_main import run_tui
            return run_tui(args.bus)
        if verb == "status" and (rc := _status(args)) is not None:
            return rc
        if verb == "demo":
            from aithermctl.tui_main import NO_TERMINAL, has_terminal
            if not args.no_tui and not has_terminal():  # before its bus and daemon are started
                print(f"{NO_TERMINAL} (or `aithermctl demo --no-tui`)", file=sys.stderr)
                return 2
            from aithermctl.demo import run_demo
            return run_demo(args)
        if verb == "fans" and args.fans_verb != "show":
            from aithermctl.fans import run_aithermd_fans
            return run_aithermd_fans(args.fans_verb, args.rest)
        from aithermctl.verbs import dispatch
        return dispatch(verb, args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
