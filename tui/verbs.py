"""The CLI verbs that talk to the daemon: each ``async def verb(client, args) -> exit code``.

:func:`dispatch` runs one under asyncio with a :class:`~aithermctl.client.DaemonClient` and turns a
:class:`~aithermctl.errors.ClientError` into its one line on stderr and its exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence

from aithermctl import render
from aithermctl.client import DaemonClient, describe_owners
from aithermctl.document import all_knobs
from aithermctl.durations import check_unit, format_duration, parse_value
from aithermctl.errors import ClientError
from aithermctl.holding import (
    hold,
    keep_hold,
    not_held_hint,
    note,
    owner_of,
    release_quietly,
    with_policy_hint,
    write,
)
from aithermd.publish import wire

Verb = Callable[[DaemonClient, argparse.Namespace], Awaitable[int]]


_print, _note = write, note


async def status(client: DaemonClient, args: argparse.Namespace) -> int:
    if args.json:
        text = await client.call("GetSnapshot")  # exactly the daemon's document, byte for byte
        _print(text if text.endswith("\n") else text + "\n")
        return wire.EXIT_OK
    doc = await client.get_snapshot()
    await describe_owners(client, (doc.get("policy") or {}).get("holds") or ())
    _print(render.status_text(doc))
    return wire.EXIT_OK




async def policy(client: DaemonClient, args: argparse.Namespace) -> int:
    if args.policy_verb == "list":
        policies = await client.list_policies()
        _print(json.dumps(policies, indent=1) + "\n" if args.json else render.policies_text(policies))
    elif args.policy_verb in ("show", "set"):
        try:
            if args.policy_verb == "show":
                _print(render.policy_text(await client.get_policy(args.name)))
                return wire.EXIT_OK
            await client.set_active_policy(args.name)
        except ClientError as exc:
            raise await with_policy_hint(client, exc, args.name) from None
        _note(f"active policy is now {args.name}")
        for line in (await client.get_policy(args.name)).get("warnings") or ():
            _note(f"warning: {line} (this rule does nothing on this machine)")
    else:
        holds, active = await client.holds(), await client.get_property("ActivePolicy")
        await client.reload()
        _note("policies reloaded")
        names = {p["name"] for p in await client.list_policies()}
        for hold in holds:  # the daemon ends them at its next tick: say so, or nobody knows
            if hold.get("policy") not in names:
                _note(f"warning: hold {hold.get('cookie')} on {hold.get('policy')} ends: that policy is gone "
                      "(put its file back and hold it again to keep it)")
        if active not in names:
            _note(f"warning: the active policy {active} is gone: aithermd falls back to its configured one")
    return wire.EXIT_OK


async def release(client: DaemonClient, args: argparse.Namespace) -> int:
    await client.release_policy(args.cookie)
    _note(f"hold {args.cookie} released")
    return wire.EXIT_OK


async def run_child(command: Sequence[str],
                    follow: Callable[[asyncio.subprocess.Process], Awaitable[int]] | None = None,
                    before_reap: Callable[[], Awaitable[None]] | None = None) -> int:
    """Run ``command`` with our stdio; SIGTERM, SIGHUP and SIGQUIT are forwarded, SIGINT is left to the
    terminal (it reaches the child's process group already). Returns its exit code, 128+N for signal N,
    127 not found, 126 not executable. With ``follow``, the child's stdout and stderr are pipes and
    ``follow(proc)`` (which copies them on and returns the exit status) is awaited instead of the child.
    With ``before_reap`` (not with ``follow``), it is awaited once the child has exited but before it is
    reaped: still in /proc (a zombie), the daemon's accounting can tell whose child it was."""
    loop = asyncio.get_running_loop()
    forwarded = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    procs: list[asyncio.subprocess.Process] = []
    early: list[int] = []  # signals that came before the child existed

    def forward(sig: int) -> None:
        if not procs:
            early.append(sig)
        elif procs[0].returncode is None:
            procs[0].send_signal(sig)

    for sig in forwarded:
        loop.add_signal_handler(sig, forward, sig)
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    try:
        try:
            pipes = {"stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.PIPE} if follow else {}
            procs.append(await asyncio.create_subprocess_exec(*command, **pipes) if before_reap is None
                         else subprocess.Popen(list(command)))  # type: ignore[arg-type]
        except FileNotFoundError:
            _note(f"{command[0]}: command not found")
            return 127
        except PermissionError:
            _note(f"{command[0]}: permission denied")
            return 126
        for sig in early:
            procs[0].send_signal(sig)
        if before_reap is not None:  # not asyncio's child watcher: it would reap the child at once
            with contextlib.suppress(ChildProcessError):  # a forwarded signal's poll() reaped it already
                await asyncio.to_thread(os.waitid, os.P_PID, procs[0].pid, os.WEXITED | os.WNOWAIT)
            await before_reap()
            rc = await asyncio.to_thread(procs[0].wait)  # type: ignore[arg-type]
        else:
            rc = await (follow(procs[0]) if follow else procs[0].wait())
    finally:
        for sig in (*forwarded, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 128 - rc if rc < 0 else rc


async def run(client: DaemonClient, args: argparse.Namespace) -> int:
    line = shlex.join(args.command)
    cookies: list[int] = []
    keeper: asyncio.Task[None] | None = None
    if args.policy is not None:
        reason = args.reason or f"aithermctl run {line}"[:200]
        held_on = await owner_of(client)  # before the hold: a restart right after it is then seen
        try:
            cookies.append(await client.hold_policy(args.policy, reason, 0.0, False))
        except ClientError as exc:  # CMD is not run without the hold it was asked to run under
            exc = await with_policy_hint(client, exc, args.policy)
            hint = not_held_hint(exc, args.policy, client.ask_password)
            exc.args = (f"{exc}\naithermctl: run: {line} was not run ({args.policy} could not be held for "
                        f"it); {hint}",)
            raise
        _note(f"holding {args.policy} (cookie {cookies[-1]}) while {line} runs")
        keeper = asyncio.ensure_future(keep_hold(client, args.policy, reason, cookies, held_on))
    try:
        if args.progress_regex is None:
            return await run_child(args.command)
        return await _run_reporting(client, args)
    finally:
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        if cookies:
            await release_quietly(client, cookies[-1])


async def _run_reporting(client: DaemonClient, args: argparse.Namespace) -> int:
    from aithermctl import progress

    async def resolve(pid: int) -> list[str]:
        if args.progress_gpus:
            return [g.strip() for g in args.progress_gpus.split(",") if g.strip()]
        doc = await client.get_snapshot()
        found = progress.gpus_of_tree(pid, doc.get("processes") or {})
        found = found or progress.gpus_from_env(os.environ, doc.get("devices") or []) or []
        if found or os.geteuid() != 0:  # another user may report only where their job alone computes
            return found or progress.gpus_of_user(doc.get("processes") or {})
        return [str(d["id"]) for d in doc.get("devices") or [] if d.get("kind") == "gpu"]

    meter = progress.RateMeter(args.progress_regex)
    return await run_child(args.command,
                           lambda proc: progress.follow(proc, meter, client.report_progress, resolve, _note))


async def override(client: DaemonClient, args: argparse.Namespace) -> int:
    first, second = args.words
    if first == "clear":
        await client.clear_override(second)
        _note(f"override of {second} cleared")
        return wire.EXIT_OK
    knob = all_knobs(await client.get_snapshot()).get(first, {})
    unit = str(knob.get("unit") or "")
    try:
        value, how = override_value(second, knob)
    except ValueError as exc:
        _note(str(exc))
        return wire.EXIT_USAGE
    applied, warnings = await client.set_override(first, value, args.seconds)
    until = f" for {format_duration(args.seconds)}" if args.seconds else " until cleared"
    shown = f"{' ' + unit if unit and unit != '%' else unit}"
    clamped = f" (asked {value:g}{shown}: clamped to the knob's range)" if applied != value else ""
    _note(f"{first} overridden to {applied:g}{shown}{how}{until}{clamped}")
    for warning in warnings:
        _note(f"warning: {warning}")
    return wire.EXIT_OK


def override_value(text: str, knob: dict) -> tuple[float, str]:
    """(value in the knob's unit, how it was worked out) for an override VALUE. ``N%`` of a power limit
    (a W knob) is N percent of its default, as in policies ('80%'). Raises ValueError."""
    value = parse_value(text)
    unit = knob.get("unit")
    if text.strip().endswith("%") and unit == "W":
        default = knob.get("default")
        if not isinstance(default, int | float):
            raise ValueError(f"{text.strip()!r} is a percentage of the default limit, and this knob reports "
                             "none: give watts")
        return round(default * value / 100.0, 1), f" ({value:g} % of the default {default:g} W)"
    check_unit(text, unit)
    return value, ""


async def gpu(client: DaemonClient, args: argparse.Namespace) -> int:
    """``gpu release GPU``: the daemon restores the GPU's originals and stops using it (before a driver
    unbind, ``nvidia-smi drain`` or a hot-remove)."""
    _note(await client.release_gpu(args.gpu))
    return wire.EXIT_OK


async def explain(client: DaemonClient, args: argparse.Namespace) -> int:
    explained = await client.explain(args.knob or "")
    if args.json:
        _print(json.dumps(explained, indent=1, ensure_ascii=False) + "\n")
        return wire.EXIT_OK
    _print(render.explain_text(explained, await client.get_snapshot(), args.knob or ""))
    return wire.EXIT_OK


async def energy_report(client: DaemonClient, args: argparse.Namespace) -> int:
    from aithermctl.processes import report_text

    report = await client.energy_report(args.since, args.by)
    _print(json.dumps(report, indent=1, ensure_ascii=False) + "\n" if args.json else report_text(report))
    return wire.EXIT_OK


async def energy(client: DaemonClient, args: argparse.Namespace) -> int:
    if getattr(args, "report", False):
        return await energy_report(client, args)
    name = os.path.basename(args.command[0])[:64] or "energy"
    # the command is our child: the process tree under us is its own share of the devices
    window = await client.start_scoped_energy_window(name, args.timeout, f"pid:{os.getpid()}")
    stopped: list[dict | None] = []

    async def stop() -> None:  # CMD has exited, not yet reaped: the daemon settles its share (attack8 T6)
        try:
            stopped.append(await client.stop_energy_window(window))
        except ClientError as exc:  # gone (an older daemon drops a timed-out window): CMD's status still
            sys.stderr.write(f"aithermctl energy: warning: {exc}; nothing to report\n")
            stopped.append(None)
    ran: list[bool] = []

    async def exited() -> None:
        ran.append(True)
        await stop()
    try:
        rc = await run_child(args.command, before_reap=exited)
    finally:
        if not stopped:
            await stop()
    result = stopped[0]
    if result is None or not ran:  # CMD could not be started (not found, not executable): nothing to report
        return rc
    if result.get("timed_out"):
        sys.stderr.write(f"aithermctl energy: warning: the energy window timed out after "
                         f"{result.get('duration_s', 0):g} s (--timeout) while the command ran on; "
                         "what was measured up to then:\n")
    if args.json:
        _print(json.dumps(result, indent=1) + "\n")
    else:
        sys.stderr.write(render.energy_text(result, shlex.join(args.command)))
    return rc


async def fans(client: DaemonClient, args: argparse.Namespace) -> int:
    from aithermctl.fans import fans_text
    _print(fans_text(await client.get_snapshot()))
    return wire.EXIT_OK


async def doctor(client: DaemonClient, args: argparse.Namespace) -> int:
    from aithermctl.doctor import run_doctor
    return await run_doctor(client, args.sysfs_root)


VERBS: dict[str, Verb] = {
    "status": status, "policy": policy, "hold": hold, "release": release, "run": run,
    "override": override, "gpu": gpu, "explain": explain, "energy": energy, "doctor": doctor, "fans": fans,
}


async def _main(verb: Verb, args: argparse.Namespace) -> int:
    client = DaemonClient(args.bus, ask_password=not getattr(args, "no_ask_password", False))
    try:
        return await verb(client, args)
    finally:
        await client.close()


def dispatch(name: str, args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(VERBS[name], args))
    except ClientError as exc:
        _note(str(exc))
        return exc.exit_code
