"""Suspend and resume with python-dbusmock's logind on a private bus: the daemon holds a delay inhibitor lock,
PrepareForSleep(true) stops every write (and releases the lock), PrepareForSleep(false) re-applies and
verifies each owned setting — a pwmN_enable the driver reset on resume is set back."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.sysfs import SysfsIO
from aithermd.runtime.daemon import Daemon
from aithermd.watchers.options import WatcherOptions
from tests.support.dbus import PrivateBus

from .conftest import NCT, read, settings_for, write

SYSTEM_PYTHON = "/usr/bin/python3"
LOGIN1, PATH, MANAGER = "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager"


def _why_not() -> str | None:
    if shutil.which("dbus-daemon") is None:
        return "dbus-daemon not installed (scripts/system-packages.txt: dbus-daemon)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import dbusmock.templates.logind"], capture_output=True)
    if probe.returncode != 0:  # the logind template needs GLib (PyGObject): the Debian python3-dbusmock
        return "system python lacks python-dbusmock's logind template (python3-dbusmock, python3-gi)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture
def logind():
    """A private system-like bus with dbusmock's logind template on it; yields the bus address."""
    bus = PrivateBus.start("system")
    mock = None
    try:
        address = bus.address
        mock = subprocess.Popen([SYSTEM_PYTHON, "-m", "dbusmock", "--template", "logind"],
                                env=dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=address),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = ["dbus-send", f"--bus={address}", "--print-reply", "--dest=org.freedesktop.DBus",
                 "/org/freedesktop/DBus", "org.freedesktop.DBus.NameHasOwner", f"string:{LOGIN1}"]
        deadline = time.monotonic() + 15
        while b"true" not in subprocess.run(probe, capture_output=True).stdout:
            assert time.monotonic() < deadline, "logind mock did not start"
            time.sleep(0.05)
        yield address
    finally:
        if mock is not None:
            mock.terminate()
            mock.wait(timeout=10)
        bus.stop()


class RecordingIO(SysfsIO):
    def __init__(self):
        self.writes: list[tuple[str, bytes]] = []

    def write(self, path, data):
        self.writes.append((path, data))
        super().write(path, data)


async def call(bus: MessageBus, iface: str, member: str, sig: str = "", body=()) -> list:
    reply = await bus.call(Message(destination=LOGIN1, path=PATH, interface=iface, member=member,
                                   signature=sig, body=list(body)))
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    return reply.body


async def prepare_for_sleep(bus: MessageBus, start: bool) -> None:
    await call(bus, "org.freedesktop.DBus.Mock", "EmitSignal", "sssav",
               [MANAGER, "PrepareForSleep", "b", [Variant("b", start)]])


async def inhibitors(bus: MessageBus) -> list:
    return [tuple(i[:4]) for i in (await call(bus, MANAGER, "ListInhibitors"))[0]]


async def until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.01)


async def test_no_writes_while_suspended_and_a_reset_pwm_enable_is_reapplied_on_resume(
        logind, tmp_path, root, policy_dir):
    original = {f"pwm{i}": read(root, f"{NCT}/pwm{i}") for i in range(1, 7)}
    io = RecordingIO()
    settings = settings_for(tmp_path, root, policy_dir, policy="steady", tick_s=0.1)
    d = Daemon(settings, backends=[HwmonBackend(str(root), io=io)],
               watchers=WatcherOptions(logind_bus=logind))
    events = []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))
    bus = await MessageBus(bus_address=logind).connect()
    task = asyncio.create_task(d.run())
    try:
        await until(lambda: d.logind is not None and d.logind.inhibited
                    and read(root, f"{NCT}/pwm1") == 153)
        assert await inhibitors(bus) == [("sleep", "aithermd", "re-apply fan and power settings after resume",
                                          "delay")]
        assert read(root, f"{NCT}/pwm1_enable") == 1

        await prepare_for_sleep(bus, True)
        await until(lambda: d.changes.paused and not d.logind.inhibited)
        assert await inhibitors(bus) == []  # released once writing stopped: logind may go on
        writes = len(io.writes)
        seq = d.hub.latest.seq
        write(root, f"{NCT}/pwm1_enable", 2)  # the driver resets the fan to automatic across the sleep
        write(root, f"{NCT}/pwm1", 77)
        await until(lambda: d.hub.latest.seq >= seq + 5)  # ticks go on: sampled, decided, nothing written
        assert len(io.writes) == writes
        assert (read(root, f"{NCT}/pwm1_enable"), read(root, f"{NCT}/pwm1")) == (2, 77)
        assert not [e for e in events if e.kind in ("drift", "conflict")]

        await prepare_for_sleep(bus, False)
        await until(lambda: not d.changes.paused and d.logind.inhibited)
        assert (read(root, f"{NCT}/pwm1_enable"), read(root, f"{NCT}/pwm1")) == (1, 153)
        await until(lambda: any(e.kind == "sleep" and e.data["action"] == "resume" for e in events))
        resumed = [e for e in events if e.kind == "sleep" and e.data["action"] == "resume"]
        assert len(resumed) == 1 and resumed[0].message.startswith("resumed: 1 setting(s) re-applied")
        assert resumed[0].data["rewritten"] == ["hwmon:nct6798-isa-0290/pwm1"]
        assert sorted(resumed[0].data["in_place"]) == [f"hwmon:nct6798-isa-0290/pwm{i}" for i in range(2, 7)]
        assert resumed[0].data["failed"] == []
        nct = os.path.realpath(root / NCT)
        assert [(os.path.realpath(os.path.dirname(p)) == nct, os.path.basename(p), data)
                for p, data in io.writes[writes:]] == [(True, "pwm1_enable", b"1\n"),
                                                       (True, "pwm1", b"153\n")]
        assert await inhibitors(bus) != []
        assert not [e for e in events if e.kind in ("drift", "conflict")]  # a resume is not a fight
    finally:
        d.request_stop()
        code = await task
        bus.disconnect()
    assert code == 0
    assert {f"pwm{i}": read(root, f"{NCT}/pwm{i}") for i in range(1, 7)} == original
