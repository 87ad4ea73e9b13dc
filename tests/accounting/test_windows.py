"""Energy windows across daemon restarts: unique ids, persisted sums and counter points, name checks,
listing one's own, scopes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aithermd.accounting.accountant import accounted_device
from aithermd.accounting.meter import EnergyMeter, Increment, points_from_json, points_to_json
from aithermd.accounting.service import STATE_FILE, EnergyService
from aithermd.accounting.windows import EnergyWindows, UnknownWindow, WrongWindow, parse_scope
from aithermd.errors import InvalidArgument
from aithermd.model import Device
from aithermd.publish.reference import reference_snapshot
from tests.support.clock import SimClock


def _snap(seq, clock, **kw):
    return replace(reference_snapshot(seq, **kw), t_wall=clock.wall(), t_mono=clock.monotonic())


def test_ids_are_random_63_bit_and_never_repeat_across_restarts(tmp_path):
    seen = set()
    for _restart in range(20):
        windows = EnergyWindows(SimClock())
        for _ in range(10):
            wid = windows.start("w", 0.0, uid=0)
            assert 0 < wid < 2**63 and wid not in seen
            seen.add(wid)


def test_stop_checks_the_name_and_leaves_a_mismatch_open():
    windows = EnergyWindows(SimClock())
    wid = windows.start("slurm-41", 0.0, uid=0)
    with pytest.raises(WrongWindow, match="slurm-41"):
        windows.stop(wid, uid=0, name="slurm-42")
    assert windows.stop(wid, uid=0, name="slurm-41")["name"] == "slurm-41"


def test_a_caller_lists_its_own_windows_and_root_all():
    windows = EnergyWindows(SimClock())
    windows.start("mine", 0.0, uid=1000)
    windows.start("theirs", 0.0, uid=1001)
    assert [w["name"] for w in windows.list(1000)] == ["mine"]
    assert sorted(w["name"] for w in windows.list(0, root=True)) == ["mine", "theirs"]


@pytest.mark.parametrize("scope", ["job:", "job:abc", "user:3", "pid:-1", "unit:a b", "cgroup:relative",
                                   "container:XYZ", "job:1;rm -rf /"])
def test_bad_scopes_are_refused(scope):
    with pytest.raises(InvalidArgument):
        parse_scope(scope)
    with pytest.raises(InvalidArgument):
        EnergyWindows(SimClock()).start("x", 0.0, uid=0, scope=scope)


def test_scoped_windows_sum_only_their_scope():
    windows = EnergyWindows(SimClock())
    a = windows.start("slurm-1", 0.0, uid=0, scope="job:1")
    b = windows.start("slurm-2", 0.0, uid=0, scope="job:2")
    assert windows.scopes() == {"job:1", "job:2"}
    windows.add(Increment(1.0, {"gpu0": 150.0, "powercap:package-0": 3.0, "powercap:package-1": 3.0,
                                "powercap:package-0:0": 4.0}, {}))
    windows.add_scoped({"job:1": {"gpu0": 100.0}, "job:2": {"gpu0": 40.0, "cpu": 5.0}}, accounted_device)
    # never more than the device's joules inside the window since the last pass (attack9 T6)
    windows.add_scoped({"job:1": {"gpu0": 100.0}}, accounted_device)
    windows.add(Increment(1.0, {"gpu0": 150.0, "powercap:package-0": 3.0}, {}))
    windows.add_scoped({"job:2": {"gpu0": 40.0, "cpu": 5.0}}, accounted_device)
    assert windows.stop(a, uid=0)["attributed"] == {"gpu0": 100.0}
    assert windows.stop(b, uid=0)["attributed"] == {"gpu0": 80.0, "cpu": 8.0}


def test_windows_and_their_sums_survive_a_restart(tmp_path):
    clock = SimClock()
    first = EnergyService(clock, tmp_path)
    first.on_publish(_snap(1, clock))
    wid = first.windows.start("slurm-7", 0.0, uid=0, scope="job:7")
    for seq in range(2, 5):  # 100 J per device and second
        clock.advance(1.0)
        first.on_publish(_snap(seq, clock))
    first.windows.add_scoped({"job:7": {"gpu0": 50.0}})
    first.stop()  # SIGTERM: saved
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert [w["id"] for w in saved["windows"]] == [wid]
    # 30 s without a daemon: the counters keep counting (100 J/s), then a new daemon reads them again
    clock.advance(30.0)
    second = EnergyService(clock, tmp_path)
    second.on_publish(_snap(35, clock))
    clock.advance(1.0)
    second.on_publish(_snap(36, clock))
    result = second.windows.stop(wid, uid=0, name="slurm-7")
    assert result["joules"]["gpu0"] == pytest.approx(300.0 + 3100.0 + 100.0)  # before, the gap, after
    assert result["attributed"] == {"gpu0": 50.0} and result["restarts"] == 1
    assert result["duration_s"] == 34.0


def test_a_crash_loses_nothing_once_the_counters_are_read_again(tmp_path):
    clock = SimClock()
    first = EnergyService(clock, tmp_path, save_every_s=60.0)
    first.on_publish(_snap(1, clock))
    wid = first.windows.start("w", 0.0, uid=0)  # saved at once (a new window)
    for seq in range(2, 12):
        clock.advance(1.0)
        first.on_publish(_snap(seq, clock))
    # kill -9: no stop(); the file holds the state of the window's start
    clock.advance(5.0)
    second = EnergyService(clock, tmp_path)
    second.on_publish(_snap(16, clock))
    assert second.windows.stop(wid, uid=0)["joules"]["gpu0"] == pytest.approx(1500.0)


def test_a_renumbered_gpu_is_not_measured_against_another_boards_point():
    clock = SimClock()
    meter = EnergyMeter(boot_id="boot-A")  # a point of unknown boot, with no clock to tell, is dropped
    meter.feed(_snap(1, clock))
    saved = points_from_json(json.loads(json.dumps(points_to_json(meter.points()))))
    clock.advance(10.0)
    snap = _snap(11, clock)
    devices = tuple(replace(d, info={**d.info, "uuid": "GPU-other"}) if d.id == "gpu0" else d
                    for d in snap.devices)
    after = EnergyMeter(seed=saved, boot_id="boot-A").feed(replace(snap, devices=devices))
    assert after.joules["gpu0"] == 0.0 and after.joules["gpu1"] == pytest.approx(1000.0)
    assert isinstance(snap.devices[0], Device)


def test_a_counter_reset_after_a_long_gap_is_unmeasured_not_guessed():
    clock = SimClock()
    meter = EnergyMeter(max_estimate_s=60.0)
    meter.feed(_snap(50, clock))
    clock.advance(600.0)
    inc = meter.feed(_snap(1, clock))  # every counter is lower now: the driver was reloaded
    assert inc.joules["gpu0"] == 0.0 and inc.unmeasured_s["gpu0"] == 600.0


def test_an_unreadable_state_file_starts_empty(tmp_path):
    (tmp_path / STATE_FILE).write_text("{not json")
    service = EnergyService(SimClock(), tmp_path)
    assert service.windows.open_count() == 0
    (tmp_path / STATE_FILE).write_text(json.dumps({"format": "aithermd-energy/1", "windows": [
        {"id": 5, "name": "ok", "uid": 0, "started": 0, "deadline": 4e9},
        {"id": "x"},
        {"id": 6, "name": "bad scope", "uid": 0, "started": 0, "deadline": 4e9, "scope": "zz"}]}))
    assert EnergyService(SimClock(), tmp_path).windows.open_count() == 1
    with pytest.raises(UnknownWindow):
        EnergyService(SimClock(), tmp_path).windows.stop(6, uid=0)


def test_the_history_file_stays_within_its_size_bound(tmp_path, monkeypatch):
    from aithermd.accounting import service as service_module
    from tests.accounting.bench import Bench

    monkeypatch.setattr(service_module, "HISTORY_MAX_BYTES", 4000)
    bench = Bench(tmp_path)
    service = bench.start_daemon(tmp_path)
    for day in range(30):  # a month of days, each with a few hundred joules on record
        service.history.days[f"2026-06-{day + 1:02d}"] = {"total": {"gpu0": 1.0}, "unit": {
            f"unit-{k}.service": {"gpu0": 100.0} for k in range(5)}}
    service.save()
    text = (tmp_path / service_module.HISTORY_FILE).read_text()
    assert len(text) <= 4000
    kept = sorted(json.loads(text)["days"])
    assert kept[-1] == "2026-06-30" and kept[0] > "2026-06-01"  # the oldest days went first
