"""The system-bus policy file on a real private dbus-daemon configured like Debian's system bus.

Root owns io.github.aithermd.Daemon1; an unprivileged uid (nobody, through setpriv) cannot own it but can call
every method; without the policy file the same call is refused, so the file is what grants it.
"""

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from _ship import SYSTEMD, need_root, need_tool

from aithermd.publish import wire
from tests.support.dbus import PrivateBus

dbus_fast = pytest.importorskip("dbus_fast")
from dbus_fast.aio import MessageBus  # noqa: E402
from dbus_fast.service import ServiceInterface, method  # noqa: E402

pytestmark = need_root

POLICY = SYSTEMD / "io.github.aithermd.Daemon1.conf"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# The rules of Debian's /usr/share/dbus-1/system.conf that matter here, then the file under test.
SYSTEM_BUS_POLICY = """\
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>"""


class StubDaemon(ServiceInterface):
    """Answers the methods an unprivileged caller tries; the real checks (polkit) are the daemon's job."""

    def __init__(self) -> None:
        super().__init__(wire.INTERFACE)

    @method()
    def GetSnapshot(self) -> "s":  # type: ignore[name-defined]  # noqa: F821
        return "{}"

    @method()
    def SetActivePolicy(self, name: "s"):  # type: ignore[name-defined]  # noqa: F821
        return None


async def private_bus(include_policy: bool) -> AsyncIterator[str]:
    need_tool("dbus-daemon")
    need_tool("setpriv")
    need_tool("dbus-send")
    # uid nobody reaches the socket: PrivateBus's directory is 0755 (pytest's tmp_path is root-only)
    include = [POLICY] if include_policy else []
    with PrivateBus.start("system", policy=SYSTEM_BUS_POLICY, include=include) as bus:
        yield bus.address


@pytest.fixture()
async def bus() -> AsyncIterator[str]:
    async for address in private_bus(include_policy=True):
        yield address


@pytest.fixture()
async def bus_without_policy() -> AsyncIterator[str]:
    async for address in private_bus(include_policy=False):
        yield address


async def dbus_send(address: str, *args: str, as_nobody: bool) -> tuple[int, str]:
    cmd = [*(NOBODY if as_nobody else []), "dbus-send", f"--bus={address}", "--print-reply", *args]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    return proc.returncode or 0, out.decode()


async def request_name(address: str, *, as_nobody: bool) -> tuple[int, str]:
    return await dbus_send(address, "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
                           "org.freedesktop.DBus.RequestName", f"string:{wire.BUS_NAME}", "uint32:4",
                           as_nobody=as_nobody)


async def call_daemon(address: str, member: str, *args: str) -> tuple[int, str]:
    return await dbus_send(address, f"--dest={wire.BUS_NAME}", wire.OBJECT_PATH, f"{wire.INTERFACE}.{member}",
                           *args, as_nobody=True)


async def own_name_as_root(address: str) -> MessageBus:
    conn = await MessageBus(bus_address=address).connect()
    conn.export(wire.OBJECT_PATH, StubDaemon())
    await conn.request_name(wire.BUS_NAME)
    return conn


async def test_nobody_cannot_own_the_name(bus: str) -> None:
    assert os.geteuid() == 0
    rc, out = await request_name(bus, as_nobody=True)
    assert rc != 0
    assert "org.freedesktop.DBus.Error.AccessDenied" in out
    assert wire.BUS_NAME in out


async def test_root_owns_the_name(bus: str) -> None:
    rc, out = await request_name(bus, as_nobody=False)
    assert rc == 0, out
    assert "uint32 1" in out  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER


async def test_nobody_may_call_every_method(bus: str) -> None:
    conn = await own_name_as_root(bus)
    try:
        rc, out = await call_daemon(bus, "GetSnapshot")
        assert (rc, out.strip().splitlines()[-1].strip()) == (0, 'string "{}"'), out
        # A privileged method is let through too: the daemon asks polkit, the bus does not decide.
        rc, out = await call_daemon(bus, "SetActivePolicy", "string:quiet")
        assert rc == 0, out
        rc, out = await dbus_send(bus, f"--dest={wire.BUS_NAME}", wire.OBJECT_PATH,
                                  "org.freedesktop.DBus.Introspectable.Introspect", as_nobody=True)
        assert rc == 0 and wire.INTERFACE in out, out
    finally:
        conn.disconnect()


async def test_without_the_policy_file_nobody_is_refused(bus_without_policy: str) -> None:
    rc, out = await request_name(bus_without_policy, as_nobody=False)
    assert rc != 0 and "AccessDenied" in out  # even root: the grant comes from the file
    # Run the stub under a name root may own here, to show method calls are refused without the file.
    conn = await MessageBus(bus_address=bus_without_policy).connect()
    try:
        conn.export(wire.OBJECT_PATH, StubDaemon())
        rc, out = await dbus_send(bus_without_policy, f"--dest={conn.unique_name}", wire.OBJECT_PATH,
                                  f"{wire.INTERFACE}.GetSnapshot", as_nobody=True)
        assert rc != 0 and "AccessDenied" in out, out
    finally:
        conn.disconnect()
