"""start/stop: --bus none, an unreachable bus, a name already taken, stopping twice."""

from __future__ import annotations

import pytest
from dbus_helpers import call, ok

from aithermd.publish import dbus_service, wire
from aithermd.publish.dbus_bus import BusUnavailable
from tests.support.dbus import PrivateBus


async def test_bus_none_is_an_idle_handle(control, hub):
    handle = await dbus_service.start("none", control, hub)
    assert handle.bus is None and handle.unique_name is None
    await handle.stop()


async def test_an_unreachable_bus_raises_a_clear_error(control, hub, tmp_path):
    with pytest.raises(BusUnavailable, match="cannot connect to the unix:path=.*nobody-here"):
        await dbus_service.start(f"unix:path={tmp_path}/nobody-here", control, hub)
    with pytest.raises(BusUnavailable, match="cannot connect"):
        await dbus_service.start("not-an-address", control, hub)


async def test_a_second_daemon_cannot_take_the_name(service, control, hub, bus_address, client):
    with pytest.raises(BusUnavailable, match="owned by another process"):
        await dbus_service.start(bus_address, control, hub)
    await ok(client, "GetSnapshot")  # the first one still serves


async def test_stop_releases_the_name_and_is_idempotent(bus_address, polkitd, control, hub, client):
    handle = await dbus_service.start(bus_address, control, hub)
    await handle.stop()
    await handle.stop()
    reply = await call(client, "NameHasOwner", "s", [wire.BUS_NAME], destination="org.freedesktop.DBus",
                       path="/org/freedesktop/DBus", interface="org.freedesktop.DBus")
    assert reply.body == [False]
    hub.publish(hub.latest)  # listeners are gone: publishing after stop is harmless


async def test_after_a_bus_restart_the_name_is_had_again_and_publishing_goes_on(control, hub):
    import asyncio

    from dbus_fast.aio import MessageBus
    from structlog.testing import capture_logs

    from aithermd.publish.dbus_keeper import DbusKeeper
    from aithermd.publish.reference import reference_snapshot

    bus = PrivateBus.start("session")
    keeper = DbusKeeper(lambda: dbus_service.start(bus.address, control, hub, snapshot_interval_s=0.0),
                        hub=hub, bus=bus.address, backoff_s=(0.05, 0.2))
    try:
        with capture_logs() as logs:
            await keeper.start()
            assert keeper.connected and hub.status["dbus"] == {"connected": True, "reconnects": 0}
            bus.restart()  # systemctl restart dbus: every connection dropped, the same address
            for _ in range(200):
                if not keeper.connected:
                    break
                await asyncio.sleep(0.02)
            hub.publish(reference_snapshot(2))  # emitting while off the bus raises nothing
            for _ in range(200):
                if keeper.connected:
                    break
                await asyncio.sleep(0.05)
        assert keeper.connected and hub.status["dbus"] == {"connected": True, "reconnects": 1}
        events = [e["event"] for e in logs]
        assert "dbus_lost" in events and "dbus_reconnected" in events
        client = await MessageBus(bus_address=bus.address).connect()
        try:
            (doc,) = await ok(client, "GetSnapshot")  # served again under the well-known name
            assert '"seq":2' in doc
        finally:
            client.disconnect()
    finally:
        await keeper.stop()
        bus.stop()
    assert hub.status["dbus"]["connected"] is False


async def test_a_refused_name_is_retried_and_logged_until_it_is_free(control, hub):
    import asyncio

    from dbus_fast import NameFlag
    from dbus_fast.aio import MessageBus
    from structlog.testing import capture_logs

    from aithermd.publish.dbus_keeper import DbusKeeper

    bus = PrivateBus.start("session")
    squatter = await MessageBus(bus_address=bus.address).connect()
    await squatter.request_name(wire.BUS_NAME, NameFlag.DO_NOT_QUEUE)
    keeper = DbusKeeper(lambda: dbus_service.start(bus.address, control, hub), hub=hub, bus=bus.address,
                        backoff_s=(0.05, 0.1))
    try:
        with capture_logs() as logs:
            await keeper.start()
            assert not keeper.connected
            await asyncio.sleep(0.5)
            squatter.disconnect()  # the other owner goes: the name is had at the next try
            for _ in range(100):
                if keeper.connected:
                    break
                await asyncio.sleep(0.05)
        assert keeper.connected
        refused = [e for e in logs if e["event"] == "dbus_name_refused"]
        assert len(refused) == 1 and "owned by another process" in refused[0]["error"], "logged once"
    finally:
        await keeper.stop()
        bus.stop()


async def test_publishing_in_the_moment_the_bus_dies_raises_nothing_and_leaves_no_failed_write(control, hub):
    """The daemon published between the bus's death and the loop noticing it: the write failed with
    BrokenPipeError, dbus-fast raised EBADF into the hub listener, and asyncio logged "Future exception was
    never retrieved" once the old connection was collected."""
    import asyncio
    import gc
    import time

    from structlog.testing import capture_logs

    from aithermd.model import Event
    from aithermd.publish.dbus_keeper import DbusKeeper
    from aithermd.publish.reference import reference_snapshot

    unhandled: list = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unhandled.append(ctx.get("message")))
    bus = PrivateBus.start("session")
    keeper = DbusKeeper(lambda: dbus_service.start(bus.address, control, hub, snapshot_interval_s=0.0),
                        hub=hub, bus=bus.address, backoff_s=(0.05, 0.2))
    try:
        with capture_logs() as logs:
            await keeper.start()
            bus.kill()
            time.sleep(0.3)  # the socket is dead; the loop has not run since
            hub.publish(reference_snapshot(2), [Event("fault", 0.0, "gpu0", "gpu0 lost", {})])
            for _ in range(200):
                if not keeper.connected:
                    break
                await asyncio.sleep(0.02)
            assert not keeper.connected
            gc.collect()
            await asyncio.sleep(0.1)
        events = [e["event"] for e in logs]
        assert "dbus_lost" in events and "listener_failed" not in events
        assert unhandled == []
    finally:
        await keeper.stop()
        bus.stop()


async def test_a_bus_restart_ends_the_holds_of_the_callers_it_disconnected(control, hub):
    """A hold tied to its caller's connection (aithermctl run) outlived a dbus-daemon restart for ever: its
    owner's unique name meant nothing on the new bus (where it may name another client). The restart
    ends every connection, so those holds end with it; a detached hold stays."""
    import asyncio

    from dbus_fast.aio import MessageBus

    from aithermd.publish.dbus_keeper import DbusKeeper

    bus = PrivateBus.start("session")
    keeper = DbusKeeper(lambda: dbus_service.start(bus.address, control, hub, snapshot_interval_s=0.0),
                        hub=hub, bus=bus.address, backoff_s=(0.05, 0.2))
    try:
        await keeper.start()
        caller = await MessageBus(bus_address=bus.address).connect()
        (tied,) = await ok(caller, "HoldPolicy", "ssdb", ["quiet", "a job", 0.0, False])
        (kept,) = await ok(caller, "HoldPolicy", "ssdb", ["quiet", "the night", 0.0, True])
        assert set(control.holds) == {tied, kept}
        bus.restart()
        for _ in range(200):
            if ("release_owner", caller.unique_name) in control.calls:
                break
            await asyncio.sleep(0.02)
        assert ("release_owner", caller.unique_name) in control.calls
        assert set(control.holds) == {kept}
    finally:
        await keeper.stop()
        bus.stop()
