"""Energy windows: joules per GPU and RAPL zone from the published energy counters."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dbus_helpers import call, ok, run_client_async

from aithermd.accounting.meter import EnergyMeter
from aithermd.accounting.windows import EnergyWindows, NotOwner, UnknownWindow, WindowLimit
from aithermd.errors import InvalidArgument
from aithermd.model import Reading, Status
from aithermd.publish import wire
from aithermd.publish.reference import reference_snapshot
from tests.support.clock import SimClock

DEVICES = ["gpu0", "gpu1", "powercap:dram", "powercap:package-0"]


def _with(snapshot, channel_id: str, value: float | None, status: Status = Status.OK):
    readings = dict(snapshot.readings)
    readings[channel_id] = Reading(channel_id, value, status)
    return replace(snapshot, readings=readings)


class Fed(EnergyWindows):
    """Windows fed from snapshots through a meter, as the energy service feeds them."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.meter = EnergyMeter()

    def on_publish(self, snapshot):
        self.add(self.meter.feed(snapshot))


def test_a_window_sums_each_devices_energy_between_start_and_stop():
    clock = SimClock()
    windows = Fed(clock)
    windows.on_publish(reference_snapshot(1))
    wid = windows.start("epoch 1", 0.0, uid=1000)
    for seq in range(2, 7):  # every energy counter grows 100 J per 1 s tick
        clock.advance(1.0)
        windows.on_publish(reference_snapshot(seq))
    result = windows.stop(wid, uid=1000)
    assert result["name"] == "epoch 1" and result["duration_s"] == 5.0
    assert result["joules"] == {d: 500.0 for d in DEVICES}
    assert result["total_j"] == 1500.0  # dram is inside package-0: counted in the package, not again
    with pytest.raises(UnknownWindow):
        windows.stop(wid, uid=1000)


def test_a_counter_that_goes_back_is_estimated_from_power_and_a_failed_read_loses_nothing():
    windows = Fed(SimClock())
    windows.on_publish(reference_snapshot(1))
    wid = windows.start("wrap", 60.0, uid=0)
    # the RAPL package counter (1100 J at seq 1) wraps and reads 5, 105, 205 J; gpu0 fails to read at seq 3
    wrapped = _with(reference_snapshot(2), "powercap:package-0/energy", 5.0)
    windows.on_publish(wrapped)
    power_w = wrapped.readings["powercap:package-0/power"].value
    windows.on_publish(_with(_with(reference_snapshot(3), "powercap:package-0/energy", 105.0),
                             "gpu0/energy", None, Status.FAILED))
    windows.on_publish(_with(reference_snapshot(4), "powercap:package-0/energy", 205.0))
    joules = windows.stop(wid, uid=0)["joules"]
    assert joules["powercap:package-0"] == pytest.approx(power_w * 1.0 + 100.0 + 100.0)
    assert joules["gpu0"] == 300.0  # 1100 → 1200, then 1200 → 1400 across the failed read
    assert joules["gpu1"] == 300.0


def test_only_the_owner_or_root_stops_a_window():
    windows = EnergyWindows(SimClock())
    wid = windows.start("mine", 0.0, uid=1000)
    with pytest.raises(NotOwner):
        windows.stop(wid, uid=1001)
    assert windows.stop(wid, uid=0, root=True)["name"] == "mine"


def test_open_windows_per_uid_are_capped_and_time_out():
    clock = SimClock()
    windows = Fed(clock, per_uid=2)
    a = windows.start("a", 10.0, uid=1000)
    windows.start("b", 0.0, uid=1000)
    with pytest.raises(WindowLimit):
        windows.start("c", 0.0, uid=1000)
    windows.start("other user", 0.0, uid=1001)
    clock.advance(10.0)
    windows.on_publish(reference_snapshot(1))
    assert windows.open_count(1000) == 1  # a timed out: no longer open, no longer counted
    windows.start("c", 0.0, uid=1000)
    assert windows.stop(a, uid=1000)["timed_out"] is True  # what it measured until then, still there
    with pytest.raises(UnknownWindow):
        windows.stop(a, uid=1000)


@pytest.mark.parametrize("timeout_s", [-1.0, float("nan"), float("inf"), 8 * 86400.0])
def test_bad_timeouts_are_refused(timeout_s):
    with pytest.raises(InvalidArgument):
        EnergyWindows(SimClock()).start("x", timeout_s, uid=0)


async def test_a_window_over_dbus_outlives_its_unprivileged_caller(service, client, hub, bus_address):
    started = await run_client_async(bus_address, [["StartEnergyWindow", "sd", ["epoch 7", 0.0]]])
    assert started[1]["error"] is None
    (wid,) = started[1]["body"]
    assert wid > 0
    for seq in range(2, 5):
        hub.publish(reference_snapshot(seq))
    stopped = await run_client_async(bus_address, [["StopEnergyWindow", "t", [wid]]])
    assert stopped[1]["error"] is None
    result = json.loads(stopped[1]["body"][0])
    assert result["name"] == "epoch 7" and result["joules"] == {d: 300.0 for d in DEVICES}
    again = await call(client, "StopEnergyWindow", "t", [wid])
    assert again.error_name == wire.ERROR_UNKNOWN_WINDOW


async def test_another_users_window_is_not_yours(service, client, bus_address):
    (wid,) = await ok(client, "StartEnergyWindow", "sd", ["root's", 0.0])
    stolen = await run_client_async(bus_address, [["StopEnergyWindow", "t", [wid]]])
    assert stolen[1]["error"] == wire.ERROR_NOT_AUTHORIZED
    await ok(client, "StopEnergyWindow", "t", [wid])


async def test_the_cap_is_a_named_error(service, client, bus_address):
    # an unprivileged user (uid 65534) opens 8 windows in one connection; the ninth is refused by name
    calls = [["StartEnergyWindow", "sd", [f"w{i}", 0.0]] for i in range(9)]
    results = (await run_client_async(bus_address, calls))[1:]  # the first line names the caller
    assert [r["error"] for r in results[:8]] == [None] * 8
    assert results[8]["error"] == wire.ERROR_LIMIT_EXCEEDED
    reply = await call(client, "StartEnergyWindow", "sd", ["bad", -3.0])
    assert reply.error_name == wire.ERROR_INVALID_ARGUMENT


def test_root_is_bounded_only_by_the_total_so_many_concurrent_jobs_each_get_a_window():
    windows = EnergyWindows(SimClock(), per_uid=2, max_windows=5)
    for job in range(5):
        windows.start(f"slurm job {job}", 0.0, uid=0)
    with pytest.raises(WindowLimit, match="5 in all"):
        windows.start("one too many", 0.0, uid=0)
    with pytest.raises(WindowLimit):
        windows.start("a user", 0.0, uid=1000)


async def test_processes_and_the_energy_report_over_dbus(bus_address, polkitd, control, client, tmp_path):
    from aithermd.publish import dbus_service
    from aithermd.publish.hub import StateHub
    from tests.accounting.bench import Bench

    bench = Bench(tmp_path)
    energy = bench.start_daemon(None)
    bench.job(5001, 101, {0: 1.0})
    bench.util[0], bench.power["gpu0"] = 100.0, 300.0
    bench.run(10)
    handle = await dbus_service.start(bus_address, control, StateHub(), snapshot_interval_s=0.0,
                                      energy=energy)
    try:
        (text,) = await ok(client, "GetProcesses")
        doc = json.loads(text)
        (row,) = doc["gpus"]["gpu0"]["processes"]
        assert row["pid"] == 5001 and row["job"] == "slurm:101" and row["sm_pct"] == 100.0
        assert doc["groups"]["job"]["slurm:101"]["gpu0"] == pytest.approx(3000.0)
        (snap,) = await ok(client, "GetSnapshot")
        assert json.loads(snap)["processes"] == doc  # status --json and the TUI get it with the snapshot
        # an unprivileged caller reads the same
        other = await run_client_async(bus_address, [["GetProcesses", "", []]])
        assert other[1]["error"] is None
        (text,) = await ok(client, "GetEnergyReport", "ds", [0.0, "job"])
        report = json.loads(text)
        assert report["rows"][0]["name"] == "slurm:101"
        row = report["rows"][0]
        assert row["joules"]["gpu0"] == pytest.approx(3000.0)  # and its CPU time's share of the package
        assert row["kwh"] == pytest.approx(row["total_j"] / 3.6e6) and row["joules"]["cpu"] > 0
        for bad in ([0.0, "user"], [float("nan"), "job"]):
            reply = await call(client, "GetEnergyReport", "ds", bad)
            assert reply.error_name == wire.ERROR_INVALID_ARGUMENT
    finally:
        await handle.stop()


async def test_a_scoped_window_stopped_over_dbus_gets_the_seconds_since_the_last_pass(
        bus_address, polkitd, control, client, tmp_path):
    """A 4 s job between two accounting passes (every 5 s): StopEnergyWindow settles one pass before it
    answers, so the window's attributed joules are the job's, not nothing (attack8 T6: −100 %)."""
    from aithermd.publish import dbus_service
    from aithermd.publish.hub import StateHub
    from tests.accounting.bench import Bench

    bench = Bench(tmp_path)
    energy = bench.start_daemon(None)
    bench.run(5)  # one pass, nobody on the GPUs
    handle = await dbus_service.start(bus_address, control, StateHub(), snapshot_interval_s=0.0,
                                      energy=energy)
    try:
        (wid,) = await ok(client, "StartScopedEnergyWindow", "sds", ["job", 0.0, "job:101"])
        bench.job(5001, 101, {0: 1.0})
        bench.util[0], bench.power["gpu0"] = 100.0, 300.0
        bench.run(4)  # no pass while it runs
        (text,) = await ok(client, "StopEnergyWindow", "t", [wid])
        doc = json.loads(text)
        assert doc["joules"]["gpu0"] == pytest.approx(4 * 300.0)
        assert doc["attributed"]["gpu0"] == pytest.approx(4 * 300.0)  # J: all of gpu0 while it ran
    finally:
        await handle.stop()
