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


async def test_losing_the_bus_is_reported_and_publishing_goes_on(control, hub, capsys):
    import asyncio

    from aithermd.publish.reference import reference_snapshot

    bus = PrivateBus.start("session")
    handle = await dbus_service.start(bus.address, control, hub, snapshot_interval_s=0.0)
    try:
        bus.kill()
        for _ in range(100):
            if not handle.bus.connected:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)
        hub.publish(reference_snapshot(2))  # emitting on a dead bus raises nothing
        assert "dbus_lost" in capsys.readouterr().err
    finally:
        await handle.stop()
        bus.stop()
