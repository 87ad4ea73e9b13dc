"""Holds as the CLI keeps them: ``aithermctl hold`` (until interrupted, until the daemon ends it, or detached)
and the hold ``aithermctl run`` keeps while its command runs (taken again after a daemon restart).

A hold that is not detached ends with our bus connection, with the daemon instance, at its ``--timeout``
(the daemon's clock: the demo's simulated time), when someone else releases it, or when a reload drops its
policy; the daemon says so with an ``Event`` signal (kind ``policy``, ``data.cookie``) and drops it from
its ``Holds`` property, which :func:`until_hold_ends` follows (asked every :data:`REHOLD_POLL_S` too, so a
missed signal costs at most that long).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import signal
import sys
from typing import Any

from aithermctl.client import DaemonClient
from aithermctl.durations import format_duration
from aithermctl.errors import (
    BusUnreachable,
    ClientError,
    DaemonError,
    DaemonNotRunning,
    NoReply,
    NotAuthorized,
)
from aithermd.publish import wire

# How often `run` asks whether aithermd is back after it left the bus (a restart, an upgrade, a crash
# that systemd restarts in RestartSec=1 s): a job waits at most this long under the wrong policy. Also how
# often `hold` looks at the daemon's holds when no signal came.
REHOLD_POLL_S = 2.0


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def note(text: str) -> None:
    print(f"aithermctl: {text}", file=sys.stderr, flush=True)


async def hold(client: DaemonClient, args: argparse.Namespace) -> int:
    """``hold POLICY``: print the cookie; without ``--detach`` hold until a signal (then release: exit 0),
    until the daemon ends the hold (its ``--timeout``: exit 0; released by someone else or its policy gone
    at a reload: exit 1), or until the daemon leaves the bus (exit 3)."""
    held_on = None if args.detach else await owner_of(client)
    try:
        cookie = await client.hold_policy(args.policy, args.reason, args.timeout, args.detach)
    except ClientError as exc:
        raise await with_policy_hint(client, exc, args.policy) from None
    write(f"{cookie}\n")
    if args.detach:
        return wire.EXIT_OK
    until = f" for {format_duration(args.timeout)}" if args.timeout else ""
    note(f"holding {args.policy} (cookie {cookie}){until}; Ctrl-C releases it")
    waiter = asyncio.ensure_future(_until_signalled())
    gone = asyncio.ensure_future(until_owner_changes(client, held_on))
    ended = asyncio.ensure_future(until_hold_ends(client, cookie))
    done, _ = await asyncio.wait({waiter, gone, ended}, return_when=asyncio.FIRST_COMPLETED)
    for task in (waiter, gone, ended):
        task.cancel()
    if ended in done and not ended.cancelled() and ended.exception() is None:
        expired, said = ended.result()
        if expired:
            note(f"hold {cookie} on {args.policy} expired after {format_duration(args.timeout)} (--timeout); "
                 "the daemon ended it")
            return wire.EXIT_OK
        note(f"the daemon ended hold {cookie}: {said or 'it is no longer held'}")
        return wire.EXIT_FAILURE
    if gone in done:
        note("aithermd left the bus; the hold ended with it")
        return wire.EXIT_NOT_RUNNING
    await release_quietly(client, cookie)
    return wire.EXIT_OK


async def _until_signalled() -> int:
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[int] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda s=sig: stop.done() or stop.set_result(s))
    try:
        return await stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


async def until_hold_ends(client: DaemonClient, cookie: int) -> tuple[bool, str]:
    """Returns ``(expired, the daemon's words)`` once the daemon no longer lists hold ``cookie`` in its
    ``Holds``: ``expired`` when it ended at its timeout. Looked at after each ``Event`` signal naming the
    cookie and every :data:`REHOLD_POLL_S`. The property follows the daemon's tick, so a hold just taken may
    not be listed yet: absence counts once the hold was seen listed, or once an event named it (the
    property is updated before the events are sent). Bus errors are left to :func:`until_owner_changes`."""
    wake = asyncio.Event()
    said: list[str] = []

    def on_signal(member: str, body: list[Any]) -> None:
        if member != "Event" or len(body) < 2 or body[0] != "policy":
            return
        try:
            event = json.loads(body[1])
        except (TypeError, ValueError):
            return
        if isinstance(event, dict) and (event.get("data") or {}).get("cookie") == cookie:
            said.append(str(event.get("message") or ""))
            wake.set()

    seen = False
    with client.listening(on_signal):
        while True:
            named = bool(said)
            try:
                listed: bool | None = any(h.get("cookie") == cookie for h in await client.holds())
            except ClientError:
                listed = None  # unknown: the daemon may be gone (until_owner_changes says so)
            if listed:
                seen = True
            elif listed is False and (seen or named):
                last = said[-1] if said else ""
                return "timed out" in last, last
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), REHOLD_POLL_S)
            except TimeoutError:
                pass


async def until_owner_changes(client: DaemonClient, held_on: tuple[str, int] | None,
                              ) -> tuple[str, int] | None:
    """Returns the owner (:func:`owner_of`) once it is no longer ``held_on``: the daemon a hold was taken on
    left, restarted, or our connection to the bus was lost (either ends the hold). The bus is asked every
    :data:`REHOLD_POLL_S`: no signal to miss, so a restart between two looks shows as a new owner."""
    while True:
        await asyncio.sleep(REHOLD_POLL_S)
        if (owner := await owner_of(client)) != held_on:
            return owner


async def release_quietly(client: DaemonClient, cookie: int) -> None:
    """Release ``cookie``; one that the daemon ended already (timeout, restart, another caller) is not an
    error here, anything else is said on stderr."""
    try:
        await client.release_policy(cookie)
    except ClientError as exc:
        if exc.dbus_name != wire.ERROR_UNKNOWN_COOKIE:
            note(f"releasing hold {cookie}: {exc}")


async def with_policy_hint(client: DaemonClient, exc: ClientError, name: str) -> ClientError:
    """``exc``, with "did you mean 'balanced'?" added when it says policy ``name`` is unknown and a loaded
    policy's name is close (as ``aithermd check`` hints at a misspelt key)."""
    if exc.dbus_name != wire.ERROR_UNKNOWN_POLICY:
        return exc
    try:
        names = [str(p.get("name")) for p in await client.list_policies()]
    except ClientError:
        return exc
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        exc.args = (f"{exc} (hint: did you mean '{close[0]}'?)",)
    return exc


def not_held_hint(exc: ClientError, policy: str, ask_password: bool) -> str:
    """What to do when ``run`` could not hold ``policy`` (``exc``): start the daemon only when it is not
    there; the caller's rights when polkit or the bus refused."""
    if isinstance(exc, DaemonNotRunning | BusUnreachable):
        return "start aithermd, or run it without aithermctl"
    if isinstance(exc, NotAuthorized):
        action = exc.action or wire.ACTION_HOLD_POLICY
        prompt = "" if ask_password else "leave out --no-ask-password so polkit can ask for a password, "
        return (f"you are not authorized to hold {policy}: {prompt}run it as root, or have an administrator "
                f"allow {action} for you in polkit (a rule in /etc/polkit-1/rules.d/)")
    return "see the error above"


async def keep_hold(client: DaemonClient, policy: str, reason: str, cookies: list[int],
                    held_on: tuple[str, int] | None) -> None:
    """While ``run``'s command runs: a hold is tied to its bus connection and to the daemon instance, so
    it ends when aithermd restarts or the dbus-daemon does (:func:`until_owner_changes`). Say so, and take
    it again (appending the new cookie to ``cookies``) as soon as a daemon answers. ``held_on``:
    :func:`owner_of` just before the hold. Runs until cancelled."""
    while True:
        owner = await until_owner_changes(client, held_on)
        if cookies:
            cookies.clear()  # that hold ended with the daemon or the connection; its cookie means nothing now
            note(f"aithermd left the bus; the hold on {policy} ended with it; taking it again when aithermd "
                 "is back")
        held_on = None  # until a hold is taken again: any daemon there is one to ask
        if owner is None:
            continue
        try:
            cookies.append(await client.hold_policy(policy, reason, 0.0, False))
        except (BusUnreachable, DaemonNotRunning, NoReply):
            continue  # the bus or the daemon still on its way back
        except DaemonError as exc:
            if exc.dbus_name == wire.ERROR_BUSY:
                continue  # the daemon still starting (its calls in flight capped)
            note(f"could not take the hold on {policy} again: {exc}")  # too many holds, a failure
            return
        except ClientError as exc:  # refused: the new daemon has no such policy, or polkit said no
            note(f"could not take the hold on {policy} again: {exc}")
            return
        held_on = owner
        note(f"aithermd is back; holding {policy} again (cookie {cookies[-1]})")


async def owner_of(client: DaemonClient) -> tuple[str, int] | None:
    """Who owns aithermd's bus name, with which of our connections asked (a hold ends with our connection
    too, and a restarted bus hands out the same unique names again); None while nobody owns it or the bus
    cannot be reached."""
    try:
        owner = await client.name_owner()
    except ClientError:
        return None
    return None if owner is None else (owner, client.connections)
