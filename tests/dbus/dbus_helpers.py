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


async def polkit_allow(bus: MessageBus, actions: list[str]) -> None:
    reply = await call(bus, "SetAllowed", "as", [actions], destination="org.freedesktop.PolicyKit1",
                       path="/org/freedesktop/PolicyKit1/Authority", interface="org.freedesktop.DBus.Mock")
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body


NOBODY = 65534


@functools.cache
def _runnable_as(uid: int) -> str | None:
    """None when this Python and the tests can run as ``uid``; else why not."""
    if os.geteuid() != 0:
        return "running a client as another uid needs root"
    probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                            "-c", f"import dbus_fast; open({str(HERE / 'client_call.py')!r}).close()"],
                           capture_output=True, text=True, cwd="/")
    return None if probe.returncode == 0 else f"uid {uid} cannot run {sys.executable}: {probe.stderr[-300:]}"


def _skip_unless_runnable_as(uid: int) -> None:
    why = _runnable_as(uid)
    if why is not None:
        pytest.skip(why)


def run_client(address: str, calls: list, *, uid: int | None = NOBODY) -> list[dict]:
    """Make ``calls`` ([member, signature, body]) from another process, as ``uid`` (None: as root).

    Returns the JSON lines it printed: first {"unique_name", "uid"}, then one per call."""
    cmd = [sys.executable, str(HERE / "client_call.py"), address, json.dumps(calls)]
    if uid is not None:
        _skip_unless_runnable_as(uid)
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def run_client_async(address: str, calls: list, *, uid: int | None = NOBODY) -> list[dict]:
    """:func:`run_client` without blocking the event loop the service runs on."""
    return await asyncio.to_thread(run_client, address, calls, uid=uid)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
