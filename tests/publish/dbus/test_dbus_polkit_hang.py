"""One user whose polkit checks hang (their own authentication agent never answers) cannot lock the other
users out (attack6 G6): each pending check holds one of the 128 replies the bus lets the daemon's
connection await; 200 hanging SetOverride calls of uid 65534 filled them, and every other non-root caller
was refused NotAuthorized (LimitsExceeded). Now one uid has at most a few checks pending (more: Busy, polkit
not asked), and a check left unanswered is refused NotAuthorized after the timeout, saying why."""

from __future__ import annotations

import asyncio
from collections import Counter

from dbus_helpers import NOBODY, call, ok, polkit_allow, run_client_async

from aithermd.publish import dbus_service, wire
from aithermd.publish.polkit import MAX_PENDING_PER_UID

MOCK = dict(destination="org.freedesktop.PolicyKit1", path="/org/freedesktop/PolicyKit1/Authority",
            interface="org.freedesktop.DBus.Mock")
OVERRIDE = ["SetOverride", "sdd", ["gpu0/power_limit", 300.0, 0.0]]
HOLD = ["HoldPolicy", "ssdb", ["quiet", "job", 0.0, False]]


async def hanging(client) -> bool:
    return (await call(client, "HaveHangingCalls", **MOCK)).body[0]


def in_flight(handle) -> int:
    """The calls the service has not answered yet, over every caller."""
    return sum(len(calls) for calls in handle.tracker._in_flight.values())


async def test_a_user_whose_polkit_checks_hang_locks_nobody_else_out(bus_address, polkitd, control, hub,
                                                                     client):
    # no uid is root here: the test's own connection (uid 0) is "another user"
    handle = await dbus_service.start(bus_address, control, hub, root_uids=(), polkit_timeout_s=2.0,
                                      snapshot_interval_s=0.0)
    try:
        await polkit_allow(client, [wire.ACTION_OVERRIDE, wire.ACTION_HOLD_POLICY])
        await call(client, "SimulateHangActions", "as", [[wire.ACTION_OVERRIDE]], **MOCK)
        floods = [asyncio.ensure_future(run_client_async(bus_address, [OVERRIDE] * 100, uid=NOBODY,
                                                         concurrent=True)) for _ in range(2)]
        seen = []
        for _ in range(1000):  # until polkit holds some of the flood's checks, and the flood has settled
            seen.append(in_flight(handle) if await hanging(client) else 0)
            if len(seen) > 20 and seen[-1] and seen[-10:] == [seen[-1]] * 10:
                break
            await asyncio.sleep(0.05)
        during = await call(client, *HOLD)  # another user, during the flood
        assert during.error_name is None, (during.error_name, during.body)
        assert seen[-1] == MAX_PENDING_PER_UID, seen[-10:]  # the flood's calls still waiting on polkit
        replies = [r for flood in floods for r in (await flood)[1:]]
        errors = Counter(r["error"] for r in replies)
        assert errors == {wire.ERROR_BUSY: 200 - MAX_PENDING_PER_UID,
                          wire.ERROR_NOT_AUTHORIZED: MAX_PENDING_PER_UID}, errors
        timed_out = [r for r in replies if r["error"] == wire.ERROR_NOT_AUTHORIZED]
        assert all("did not answer" in r["body"][0] for r in timed_out), timed_out[0]
        busy = next(r for r in replies if r["error"] == wire.ERROR_BUSY)
        assert "waiting for polkit" in busy["body"][0]
        assert control.calls == [("hold_policy", "quiet")] or control.calls[0][0] == "hold_policy"
        # polkit answers at last: the flooding user may ask again
        await call(client, "ReleaseHangingCalls", **MOCK)
        await call(client, "SimulateHangActions", "as", [[]], **MOCK)
        after = await run_client_async(bus_address, [OVERRIDE], uid=NOBODY)
        assert after[1]["error"] is None, after
    finally:
        await call(client, "SimulateHangActions", "as", [[]], **MOCK)
        await call(client, "ReleaseHangingCalls", **MOCK)
        await handle.stop()


async def test_root_is_never_asked_even_during_a_flood(service, client, control, bus_address):
    await call(client, "SimulateHang", "b", [True], **MOCK)
    try:
        flood = asyncio.ensure_future(run_client_async(bus_address, [OVERRIDE] * 20, uid=NOBODY,
                                                       concurrent=True))
        for _ in range(200):
            if await hanging(client):
                break
            await asyncio.sleep(0.05)
        await ok(client, *OVERRIDE)  # root: no polkit check
    finally:
        await call(client, "SimulateHang", "b", [False], **MOCK)
        await call(client, "ReleaseHangingCalls", **MOCK)
    await flood
