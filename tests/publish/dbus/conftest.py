"""A private system-like bus (real dbus-daemon), polkit through python-dbusmock, a fake DaemonControl, and
the service under test started on that bus."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from dbus_fast.aio import MessageBus
from dbus_helpers import HERE, polkit_allow
from fake_control import FakeControl

from aithermd.publish import dbus_service
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot
from tests.support.dbus import PrivateBus


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def bus_address() -> Iterator[str]:
    """A dbus-daemon of our own with a system-bus-like policy; its socket reachable by any uid (the
    unprivileged client runs as uid 65534)."""
    with PrivateBus.start("system") as bus:
        yield bus.address


@pytest.fixture(scope="session")
def polkitd(bus_address: str) -> Iterator[subprocess.Popen]:
    """python-dbusmock's polkitd template on our bus (denies everything until told otherwise), with
    password-protected actions (polkitd_auth.py)."""
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=bus_address)
    proc = subprocess.Popen([sys.executable, "-m", "dbusmock", "--template",
                             str(HERE / "polkitd_auth.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        probe = ["dbus-send", f"--bus={bus_address}", "--print-reply", "--dest=org.freedesktop.DBus",
                 "/org/freedesktop/DBus", "org.freedesktop.DBus.NameHasOwner",
                 "string:org.freedesktop.PolicyKit1"]
        _wait_for(lambda: b"true" in subprocess.run(probe, capture_output=True).stdout)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def client(bus_address: str, polkitd) -> AsyncIterator[MessageBus]:
    """A root client connection; polkit reset to deny everything."""
    bus = await MessageBus(bus_address=bus_address).connect()
    await polkit_allow(bus, [])
    yield bus
    bus.disconnect()


@pytest.fixture
def hub() -> StateHub:
    hub = StateHub()
    hub.publish(reference_snapshot(1))
    return hub


@pytest.fixture
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture
async def service(bus_address: str, polkitd, control: FakeControl, hub: StateHub):
    """The service with root treated as root."""
    handle = await dbus_service.start(bus_address, control, hub, snapshot_interval_s=0.0)
    yield handle
    await handle.stop()


@pytest.fixture
async def strict_service(bus_address: str, polkitd, control: FakeControl, hub: StateHub):
    """The service with no uid treated as root, so every caller (this root test too) goes through polkit."""
    handle = await dbus_service.start(bus_address, control, hub, root_uids=(), snapshot_interval_s=0.0)
    yield handle
    await handle.stop()

