"""RAPL zones from the recorded powercap trees: names, power across counter wrap, limits, root-only energy."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aithermd.backends.powercap import ROOT_ONLY, RaplBackend, energy_increase_uj
from aithermd.errors import NoPermission, OutOfRange, UnknownKnob
from aithermd.model import Status
from aithermd.sim import ttar
from tests.support.clock import SimClock

from .faults import FaultIO
from .helpers import TTAR

MAX_RANGE = 262143328850


@pytest.fixture
def procfs_root(tmp_path) -> Path:
    ttar.extract(TTAR / "prometheus-procfs-sys-class-powercap-intel-rapl.ttar", tmp_path, strip="fixtures")
    return tmp_path / "sys"


@pytest.fixture
def node_root(tmp_path) -> Path:
    ttar.extract(TTAR / "node-exporter-sys-class-powercap-intel-rapl.ttar", tmp_path)
    return tmp_path / "sys"


def zone_file(root: Path, zone: str, name: str) -> Path:
    return root / "class" / "powercap" / zone / name


def test_zones_are_named_by_their_name_file(procfs_root):
    backend = RaplBackend(str(procfs_root), clock=SimClock())
    devices = {d.id: d for d in backend.discover()}
    assert list(devices) == ["powercap:package-0", "powercap:core", "powercap:package-10"]
    assert devices["powercap:core"].info["parent"] == "powercap:package-0"
    pkg = devices["powercap:package-0"]
    assert [c.id for c in pkg.channels] == ["powercap:package-0/power", "powercap:package-0/energy"]
    pl1, pl2 = pkg.knobs
    assert (pl1.id, pl1.kind, pl1.max, pl1.unit, pl1.writable) == (
        "powercap:package-0/pl1",
        "pl1",
        95.0,
        "W",
        True,
    )
    assert (pl2.id, pl2.kind, pl2.max) == ("powercap:package-0/pl2", "pl2", None)  # max_power_uw 0: unknown
    assert pkg.info["pl1_time_window_s"] == pytest.approx(0.999424)
    assert devices["powercap:core"].knobs[0].max is None  # empty constraint_0_max_power_uw
    sample = backend.sample()
    assert sample.knobs["powercap:package-0/pl1"].value == 4090.0
    assert sample.readings["powercap:package-0/energy"].value == pytest.approx(240422.366267)
    first_power = sample.readings["powercap:package-0/power"]
    assert first_power.status == Status.STALE and first_power.value is None
    backend.close()


def test_duplicate_zone_names_get_numbered_in_bus_order(node_root):
    pc = node_root / "class" / "powercap"
    for src, dst in (("intel-rapl:0", "intel-rapl:1"), ("intel-rapl:0:0", "intel-rapl:1:0")):
        shutil.copytree(pc / src, pc / dst)
    (pc / "intel-rapl:1" / "name").write_text("package-1\n")
    backend = RaplBackend(str(node_root), clock=SimClock())
    devices = backend.discover()
    assert [d.id for d in devices] == [
        "powercap:package-0",
        "powercap:core",
        "powercap:package-1",
        "powercap:core#2",
    ]
    assert devices[3].info["parent"] == "powercap:package-1"
    assert devices[3].name == "core"
    backend.close()


def test_zones_under_devices_virtual_powercap(node_root, tmp_path):
    root = tmp_path / "other"
    virt = root / "devices" / "virtual" / "powercap" / "intel-rapl"
    virt.mkdir(parents=True)
    shutil.copytree(node_root / "class" / "powercap" / "intel-rapl:0", virt / "intel-rapl:0")
    shutil.copytree(
        node_root / "class" / "powercap" / "intel-rapl:0:0", virt / "intel-rapl:0" / "intel-rapl:0:0"
    )
    backend = RaplBackend(str(root), clock=SimClock())
    assert [d.id for d in backend.discover()] == ["powercap:package-0", "powercap:core"]
    backend.close()


def test_energy_increase_across_wrap():
    assert energy_increase_uj(100, 250, MAX_RANGE) == 150
    assert energy_increase_uj(MAX_RANGE - 100, 50, MAX_RANGE) == 150
    assert energy_increase_uj(500, 50, None) is None


def test_power_right_across_a_wrap_with_a_real_recording(node_root):
    """Replay the recorded laptop package energy (µJ per ~100 ms interval) into energy_uj, starting just
    below max_energy_range_uj so the counter wraps, and compare with energy / measured interval."""
    rows = [
        line.split()
        for line in (TTAR / "laptop-rapl-msr-package0-energy-delta-100ms-idle-stress-idle.log")
        .read_text()
        .splitlines()
        if line.strip()
    ]
    assert len(rows) == 200
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    counter = MAX_RANGE - 3_000_000
    energy.write_text(f"{counter}\n")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    start = backend.sample().readings["powercap:package-0/energy"].value
    wraps, total_uj = 0, 0
    for (t0, _, _), (t1, delta, _) in zip(rows, rows[1:], strict=False):
        dt = (int(t1) - int(t0)) / 1e6
        before = counter
        counter = (counter + int(delta)) % MAX_RANGE
        wraps += counter < before
        total_uj += int(delta)
        energy.write_text(f"{counter}\n")
        clock.advance(dt)
        sample = backend.sample()
        power = sample.readings["powercap:package-0/power"]
        assert power.status == Status.OK
        assert power.value == pytest.approx(int(delta) / 1e6 / dt, rel=1e-9)
        assert sample.readings["powercap:package-0/energy"].value == pytest.approx(start + total_uj / 1e6)
    assert wraps == 1
    backend.close()


def test_an_interval_the_machine_slept_in_keeps_its_energy_and_has_no_power(node_root):
    """s2idle: the package counter goes on while the monotonic clock stops. 120 J drawn in a 60 s sleep
    read as one 119 W sample on a 50 W package; half an hour's as a reset whose energy was dropped. (A
    sleep longer than the counter can represent at the zone's highest power is discarded, as any gap.)"""
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    counter = 1_000_000_000
    energy.write_text(f"{counter}\n")
    first = backend.sample().readings["powercap:package-0/energy"].value
    for sleep_s, sleep_j in ((60.0, 120.0), (1800.0, 2700.0)):  # 2 W, then 1.5 W asleep
        counter += 50_000_000  # 1 s at 50 W
        clock.advance(1.0)
        energy.write_text(f"{counter}\n")
        assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(50.0)
        clock.advance(0.5)
        clock.suspend(sleep_s)
        clock.advance(0.5)
        counter += int((sleep_j + 50.0) * 1e6)  # asleep, and 1 s awake at 50 W
        energy.write_text(f"{counter}\n")
        sample = backend.sample()
        power = sample.readings["powercap:package-0/power"]
        assert power.status == Status.STALE and power.value is None
        assert f"the machine slept {sleep_s:.0f} s in this interval" in power.detail
        assert sample.readings["powercap:package-0/energy"].value == pytest.approx(
            first + (counter - 1_000_000_000) / 1e6)  # nothing dropped
    total = backend.sample().readings["powercap:package-0/energy"].value
    clock.suspend(60.0)  # S3: the counter reset with the package; counted as a wrap, 163 kJ never used
    clock.advance(1.0)
    energy.write_text("40000000\n")
    sample = backend.sample()
    assert sample.readings["powercap:package-0/power"].status == Status.STALE
    assert "energy_uj went back: a reset or a wrap, not counted" in sample.readings[
        "powercap:package-0/power"].detail
    assert sample.readings["powercap:package-0/energy"].value == pytest.approx(total)
    energy.write_text("90000000\n")
    clock.advance(1.0)
    assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(50.0)
    backend.close()


def test_power_uses_the_measured_interval_not_a_nominal_one(node_root):
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    energy.write_text("1000000\n")
    backend.sample()
    clock.advance(2.5)  # a late tick
    energy.write_text("51000000\n")
    assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(20.0)
    backend.close()


def test_energy_readable_only_by_root_is_reported_not_raised(node_root):
    io = FaultIO()
    io.open_faults["energy_uj"] = [OSError(errno.EACCES, "Permission denied")]
    backend = RaplBackend(str(node_root), clock=SimClock(), io=io)
    devices = backend.discover()
    assert devices[0].info["energy_why_not"] == ROOT_ONLY
    sample = backend.sample()
    for cid in ("powercap:package-0/power", "powercap:package-0/energy"):
        assert sample.readings[cid].status == Status.NOT_SUPPORTED
        assert sample.readings[cid].detail == ROOT_ONLY
    assert sample.knobs["powercap:package-0/pl1"].value == 4090.0  # limits still read
    backend.close()


@pytest.mark.parametrize("code", [errno.EIO, errno.ENODATA, errno.EAGAIN])
def test_energy_read_fault_fails_that_zone_only(node_root, code):
    io = FaultIO()
    backend = RaplBackend(str(node_root), clock=SimClock(), io=io)
    backend.discover()
    io.faults["intel-rapl:0/energy_uj"] = [OSError(code, os.strerror(code))]
    sample = backend.sample()
    assert sample.readings["powercap:package-0/power"].status == Status.FAILED
    assert sample.readings["powercap:core/energy"].status == Status.OK
    backend.close()


def test_limit_write_save_restore(node_root):
    backend = RaplBackend(str(node_root), clock=SimClock())
    backend.discover()
    limit = zone_file(node_root, "intel-rapl:0", "constraint_0_power_limit_uw")
    window = zone_file(node_root, "intel-rapl:0", "constraint_0_time_window_us")
    saved = backend.save_knob("powercap:package-0/pl1")
    assert saved == {"power_limit_uw": 4090000000, "time_window_us": 999424}
    backend.write_knob("powercap:package-0/pl1", 65.5)
    assert limit.read_text() == "65500000\n"
    assert backend.read_knob("powercap:package-0/pl1").value == 65.5
    window.write_text("28000000\n")
    backend.restore_knob("powercap:package-0/pl1", saved)
    assert limit.read_text() == "4090000000\n" and window.read_text() == "999424\n"
    backend.close()


@pytest.mark.parametrize("value", [0.0, -5.0, 95.01, float("nan")])
def test_limit_outside_constraints_is_refused(node_root, value):
    backend = RaplBackend(str(node_root), clock=SimClock())
    backend.discover()
    with pytest.raises(OutOfRange):
        backend.write_knob("powercap:package-0/pl1", value)
    assert zone_file(node_root, "intel-rapl:0", "constraint_0_power_limit_uw").read_text() == "4090000000\n"
    backend.close()


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_limit_without_a_stated_max_still_refuses_non_finite_values(procfs_root, value):
    backend = RaplBackend(str(procfs_root), clock=SimClock())
    backend.discover()
    limit = zone_file(procfs_root, "intel-rapl:0", "constraint_1_power_limit_uw")
    before = limit.read_text()
    with pytest.raises(OutOfRange):
        backend.write_knob("powercap:package-0/pl2", value)  # max_power_uw 0: no max to compare with
    assert limit.read_text() == before
    backend.close()


def test_limit_write_without_permission(node_root):
    io = FaultIO()
    io.write_faults["constraint_0_power_limit_uw"] = OSError(errno.EACCES, "Permission denied")
    backend = RaplBackend(str(node_root), clock=SimClock(), io=io)
    backend.discover()
    with pytest.raises(NoPermission):
        backend.write_knob("powercap:package-0/pl1", 50.0)
    with pytest.raises(UnknownKnob):
        backend.write_knob("powercap:package-0/pl4", 50.0)
    backend.close()


def test_not_writable_limit_says_why(node_root):
    class ReadOnly(FaultIO):
        def writable(self, path: str) -> bool:
            return False

    backend = RaplBackend(str(node_root), clock=SimClock(), io=ReadOnly())
    knob = backend.discover()[0].knobs[0]
    assert knob.writable is False
    why = "needs root" if os.geteuid() else "permission denied to root (the file's mode, or a security " \
        "module)"
    assert knob.why_not == f"constraint_0_power_limit_uw not writable ({why})"
    backend.close()


@given(start=st.integers(0, MAX_RANGE - 1),
       steps=st.lists(st.tuples(st.floats(0.0, 4999.0), st.floats(0.001, 5.0)), min_size=1, max_size=30))
def test_power_is_energy_over_interval_for_any_counter_path(start, steps):
    """Property: whatever the start and any plausible power (below MAX_PLAUSIBLE_W) over any interval,
    across wraps, power is the true increase over the measured interval and the energy total never goes
    backwards."""
    from aithermd.backends.powercap import _Zone
    from aithermd.backends.sysfs import Attribute, SysfsIO

    backend = RaplBackend("unused", clock=SimClock())
    zone = _Zone("powercap:package-0", Attribute(SysfsIO(), "unused"), None, MAX_RANGE)
    t, counter = 0.0, start
    backend._account(zone, counter, t)
    last_total = start
    for watts, dt in steps:
        delta = int(watts * dt * 1e6)
        counter = (counter + delta) % MAX_RANGE
        t += dt
        power, energy = backend._account(zone, counter, t)
        assert power.value == pytest.approx(delta / 1e6 / dt)
        assert energy.value * 1e6 == pytest.approx(last_total + delta)
        last_total += delta


def test_a_counter_reset_is_implausible_not_a_huge_wrap(node_root):
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    energy.write_text("200000000000\n")  # 200 kJ into the counter
    backend.sample()
    clock.advance(1.0)
    energy.write_text("5000000\n")  # reset by firmware after resume: read as a wrap it would be ~kW·h/s
    readings = backend.sample().readings
    assert readings["powercap:package-0/power"].status is Status.IMPLAUSIBLE
    assert readings["powercap:package-0/energy"].value == pytest.approx(200000.0)  # nothing counted
    clock.advance(1.0)
    energy.write_text("35000000\n")  # counting resumes from the new base
    assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(30.0)
    backend.close()


def test_discovering_again_keeps_each_zones_counter(node_root):
    """A reload probes the zones again: power right at the next read, the energy total runs on."""
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    energy.write_text("1000000\n")
    assert backend.sample().readings["powercap:package-0/energy"].value == pytest.approx(1.0)
    clock.advance(1.0)
    energy.write_text("21000000\n")
    backend.sample()
    backend.discover()
    clock.advance(2.0)
    energy.write_text("81000000\n")
    readings = backend.sample().readings
    assert readings["powercap:package-0/power"].value == pytest.approx(30.0)
    assert readings["powercap:package-0/energy"].value == pytest.approx(81.0)
    backend.close()


def test_a_zone_that_leaves_and_comes_back_goes_on_from_its_total(node_root, tmp_path):
    """``rmmod intel_rapl_msr`` with a rescan while the zone is absent, then ``modprobe``: the zone's energy
    total (J) goes on from where it was, never from the raw counter (attack8 T9: 292 kJ → 30 kJ, which
    Prometheus reads as a counter reset)."""
    zone = node_root / "class" / "powercap" / "intel-rapl:0"
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    raw = MAX_RANGE - 30_000_000_000  # 30 kJ before the wrap
    for _ in range(600):  # 10 min at 100 W, one wrap
        clock.advance(1.0)
        raw = (raw + 100_000_000) % (MAX_RANGE + 1)
        (zone / "energy_uj").write_text(f"{raw}\n")
        total = backend.sample().readings["powercap:package-0/energy"].value
    assert total > 60_000.0
    kept = tmp_path / "zone"
    shutil.copytree(zone, kept)
    shutil.rmtree(zone)
    assert "powercap:package-0" not in {d.id for d in backend.discover()}
    clock.advance(1.0)
    raw += 100_000_000  # the hardware counter ran on while the driver was out
    shutil.copytree(kept, zone)
    (zone / "energy_uj").write_text(f"{raw}\n")
    assert "powercap:package-0" in {d.id for d in backend.discover()}
    clock.advance(1.0)
    (zone / "energy_uj").write_text(f"{raw + 100_000_000}\n")
    back = backend.sample().readings["powercap:package-0/energy"]
    assert back.status is Status.OK and back.value == pytest.approx(total + 200.0)
    backend.close()


@pytest.mark.parametrize(("glitch_uj", "surge_w"), [(4_000_000_000, 0.0), (0, 300.0)])
def test_one_bad_energy_read_is_never_counted_a_real_surge_is(node_root, glitch_uj, surge_w):
    """A 50 W package (constraints up to 95 W): one ``energy_uj`` read +4 kJ (4 050 W, under the absolute
    5 kW bound) is held and the next read, measured from the last good one, leaves it out (attack8 T3: +3.95
    kJ counted); a real surge to 300 W (PL2, an "unlimited" board: attack5 C8) is counted in full."""
    energy = zone_file(node_root, "intel-rapl:0", "energy_uj")
    clock = SimClock()
    backend = RaplBackend(str(node_root), clock=clock)
    backend.discover()
    raw, truth, first = 1_000_000, 0.0, None
    for s in range(60):
        watts = surge_w if surge_w and s >= 30 else 50.0
        clock.advance(1.0)
        raw += int(watts * 1e6)
        truth += watts if s else 0.0
        energy.write_text(f"{raw + (glitch_uj if s == 30 else 0)}\n")
        readings = backend.sample().readings
        first = readings["powercap:package-0/energy"].value if first is None else first
        if s == 30:
            assert readings["powercap:package-0/power"].status is Status.STALE
    total = readings["powercap:package-0/energy"].value - first
    assert total == pytest.approx(truth)  # J
    assert readings["powercap:package-0/power"].value == pytest.approx(surge_w or 50.0)  # W
    backend.close()
