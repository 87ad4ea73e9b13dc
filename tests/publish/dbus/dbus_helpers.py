"""Helpers of the D-Bus tests: calls, polkit mock control, a client in another process."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from aithermd.publish import wire

HERE = Path(__file__).parent


async def call(bus: MessageBus, member: str, signature: str = "", body: list | None = None, *,
               destination: str = wire.BUS_NAME, path: str = wire.OBJECT_PATH,
               interface: str = wire.INTERFACE) -> Message:
    """One method call; returns the reply message (METHOD_RETURN or ERROR)."""
    return await bus.call(Message(destination=destination, path=path, interface=interface, member=member,
                                  signature=signature, body=body or []))


async def ok(bus: MessageBus, member: str, signature: str = "", body: list | None = None) -> list:
    reply = await call(bus, member, signature, body)
    assert reply.message_type is MessageType.METHOD_RETURN, (reply.error_name, reply.body)
    return reply.body


async def polkit_allow(bus: MessageBus, actions: list[str], *,
                       auth_required: list[str] | None = None) -> None:
    """polkit (the polkitd_auth.py mock) allows ``actions`` and asks a password for ``auth_required``."""
    for member, listed in (("SetAllowed", actions), ("SetAuthRequired", auth_required or [])):
        reply = await call(bus, member, "as", [listed], destination="org.freedesktop.PolicyKit1",
                           path="/org/freedesktop/PolicyKit1/Authority",
                           interface="org.freedesktop.DBus.Mock")
        assert reply.message_type is MessageType.METHOD_RETURN, reply.body


async def polkit_checks(bus: MessageBus) -> list[tuple[str, int]]:
    """(action, flags) of every CheckAuthorization polkit has been asked since the last call; the log is
    cleared."""
    mock = dict(destination="org.freedesktop.PolicyKit1", path="/org/freedesktop/PolicyKit1/Authority",
                interface="org.freedesktop.DBus.Mock")
    reply = await call(bus, "GetMethodCalls", "s", ["CheckAuthorization"], **mock)
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body
    await call(bus, "ClearCalls", **mock)
    return [(str(args[1].value), int(args[3].value)) for _stamp, args in reply.body[0]]


NOBODY = 65534


@functools.cache
def _runtime_for_others() -> tuple[str, str]:
    """(python, directory) that another uid can use whatever the checkout's permissions (CI may clone into
    a 0700 directory): the base interpreter, and a world-readable copy of client_call.py and dbus_fast."""
    import atexit
    import shutil
    import tempfile

    import dbus_fast

    tmp = Path(tempfile.mkdtemp(prefix="aithermd-client-"))
    atexit.register(shutil.rmtree, tmp, True)
    shutil.copy(HERE / "client_call.py", tmp / "client_call.py")
    shutil.copytree(Path(dbus_fast.__file__).parent, tmp / "dbus_fast")
    for path in (tmp, *tmp.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp.chmod(0o755)
    python = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(python), str(tmp)


@functools.cache
def _runnable_as(uid: int) -> str | None:
    """None when the tests can run a client as ``uid``; else why not."""
    if os.geteuid() != 0:
        return "running a client as another uid needs root"
    python, where = _runtime_for_others()
    probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I",
                            "-c", f"import sys; sys.path.insert(0, {where!r}); import dbus_fast"],
                           capture_output=True, text=True, cwd="/")
    return None if probe.returncode == 0 else f"uid {uid} cannot run {python}: {probe.stderr[-300:]}"


def _skip_unless_runnable_as(uid: int) -> None:
    why = _runnable_as(uid)
    if why is not None:
        pytest.skip(why)


def run_client(address: str, calls: list, *, uid: int | None = NOBODY,
               concurrent: bool = False) -> list[dict]:
    """Make ``calls`` ([member, signature, body]) from another process, as ``uid`` (None: as root); with
    ``concurrent``, all at once.

    Returns the JSON lines it printed: first {"unique_name", "uid"}, then one per call."""
    more = ["--concurrent"] if concurrent else []
    cmd, env = [sys.executable, str(HERE / "client_call.py"), address, json.dumps(calls), *more], None
    if uid is not None:
        _skip_unless_runnable_as(uid)
        python, where = _runtime_for_others()  # the base interpreter with our copy of dbus_fast first
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python,
               f"{where}/client_call.py", address, json.dumps(calls), *more]
        env = dict(os.environ, PYTHONPATH=where)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def run_client_async(address: str, calls: list, *, uid: int | None = NOBODY,
                           concurrent: bool = False) -> list[dict]:
    """:func:`run_client` without blocking the event loop the service runs on."""
    return await asyncio.to_thread(run_client, address, calls, uid=uid, concurrent=concurrent)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
