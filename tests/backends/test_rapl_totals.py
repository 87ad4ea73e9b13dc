"""RAPL as it really is, on recorded trees: the package exposed twice (MSR and MMIO) counted once, subzones
never added to their package, psys apart, AMD sockets from amd_energy, a gap the counter cannot represent
discarded, an unreadable energy_uj logged once and probed again on rediscovery."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog

from aithermd.accounting.meter import EnergyMeter
from aithermd.accounting.windows import EnergyWindows
from aithermd.backends.powercap import ROOT_ONLY, RaplBackend
from aithermd.model import Snapshot, Status, in_total, is_cpu_package
from aithermd.policy import sampling
from tests.support.clock import SimClock
from tests.support.machines import SUPERMICRO, copy_machine

from .faults import FaultIO


@pytest.fixture
def root(tmp_path) -> Path:
    return copy_machine(tmp_path, "node-exporter-sys-class-powercap-intel-rapl.ttar")


def zone(root: Path, name: str) -> Path:
    return root / "class" / "powercap" / name


def with_mmio_copy(root: Path) -> None:
    """Tiger Lake and later: intel_rapl registers package-0 again through MMIO (same counter)."""
    shutil.copytree(zone(root, "intel-rapl:0"), zone(root, "intel-rapl-mmio:0"))


def with_psys(root: Path) -> None:
    shutil.copytree(zone(root, "intel-rapl:0"), zone(root, "intel-rapl:1"))
    (zone(root, "intel-rapl:1") / "name").write_text("psys\n")


def set_energy(root: Path, uj: int) -> None:
    for name in ("intel-rapl:0", "intel-rapl-mmio:0", "intel-rapl:1"):
        if zone(root, name).is_dir():
            (zone(root, name) / "energy_uj").write_text(f"{uj}\n")
    (zone(root, "intel-rapl:0:0") / "energy_uj").write_text(f"{uj // 2}\n")  # core: half the package


def test_the_package_exposed_twice_is_one_package_in_every_total(root):
    with_mmio_copy(root)
    with_psys(root)
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    devices = {d.id: d for d in backend.discover()}
    assert set(devices) == {"powercap:package-0", "powercap:core", "powercap:psys", "powercap:package-0#2"}
    copy = devices["powercap:package-0#2"]
    assert copy.info["duplicate_of"] == "powercap:package-0" and not in_total(copy)
    assert [d for d in devices if is_cpu_package(devices[d])] == ["powercap:package-0"]
    assert devices["powercap:core"].info["role"] == "core" and not in_total(devices["powercap:core"])
    assert devices["powercap:psys"].info["role"] == "platform" and not in_total(devices["powercap:psys"])
    # the policies' CPU package power reads package-0 alone: not its core, psys or the MMIO copy
    plan = SimpleNamespace(needs={"cpu/package_power": 10.0}, devices=tuple(devices.values()), knobs={})
    (item,) = sampling.build([plan]).items
    assert item[3] == ("powercap:package-0/power",)
    # energy windows: the total counts the package once; psys is given apart
    windows, meter = EnergyWindows(clock), EnergyMeter()
    tup = tuple(devices.values())
    set_energy(root, 1_000_000_000)
    windows.add(meter.feed(Snapshot(1, clock.monotonic(), clock.wall(), tup, backend.sample().readings)))
    wid = windows.start("job", 0.0, uid=0)
    clock.advance(10.0)
    set_energy(root, 1_500_000_000)  # 500 J in the package (50 W), 250 J of it in the core
    windows.add(meter.feed(Snapshot(2, clock.monotonic(), clock.wall(), tup, backend.sample().readings)))
    result = windows.stop(wid, uid=0)
    assert result["joules"]["powercap:package-0"] == pytest.approx(500.0)
    assert result["joules"]["powercap:core"] == pytest.approx(250.0)
    assert result["total_j"] == pytest.approx(500.0), "not 1750 J: core, psys and the copy are not added"
    assert result["platform_j"] == pytest.approx(500.0)
    backend.close()


def test_amd_sockets_without_powercap_come_from_amd_energy(tmp_path):
    root = copy_machine(tmp_path, SUPERMICRO)
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    devices = backend.discover()
    assert [(d.id, d.info["role"], d.info["source"]) for d in devices] == [
        ("powercap:package-0", "package", "amd_energy"), ("powercap:package-1", "package", "amd_energy")]
    assert all(is_cpu_package(d) for d in devices) and all(not d.knobs for d in devices)
    first = backend.sample().readings
    assert first["powercap:package-0/energy"].value == pytest.approx(54_840_000.0)  # µJ → J
    hwmon = next((root / "devices" / "platform" / "amd_energy.0" / "hwmon").iterdir())
    (hwmon / "energy49_input").write_text(f"{54_840_000_000_000 + 180_000_000}\n")  # +180 J on socket 0
    clock.advance(1.0)
    assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(180.0)
    backend.close()


def test_a_gap_longer_than_the_counter_can_represent_is_discarded(root):
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    backend.discover()
    set_energy(root, 1_000_000_000)
    backend.sample()
    clock.advance(4000.0)  # max_energy_range_uj 262 kJ at the zone's 95 W max wraps in ~2760 s
    set_energy(root, 1_050_000_000)  # looks like 50 J: 0.0125 W over the gap, a lie after unseen wraps
    s = backend.sample().readings
    power = s["powercap:package-0/power"]
    assert power.status is Status.STALE and "longer than energy_uj can represent" in power.detail
    assert s["powercap:package-0/energy"].value == pytest.approx(1000.0), "nothing added for the gap"
    clock.advance(1.0)
    set_energy(root, 1_080_000_000)
    assert backend.sample().readings["powercap:package-0/power"].value == pytest.approx(30.0)
    backend.close()


def test_unreadable_energy_is_logged_once_and_probed_again_on_rediscovery(root):
    io = FaultIO()
    io.open_faults["intel-rapl:0/energy_uj"] = [OSError(errno.EACCES, "Permission denied")]
    backend = RaplBackend(str(root), clock=SimClock(), io=io)
    with structlog.testing.capture_logs() as logs:
        backend.discover()
        backend.discover()  # a reload that finds it still unreadable says nothing new
    said = [e for e in logs if e["event"] == "rapl_energy_unavailable"]
    assert len(said) == 1 and said[0]["zone"] == "powercap:package-0" and said[0]["reason"] == ROOT_ONLY
    assert backend.sample().readings["powercap:package-0/power"].detail == ROOT_ONLY
    io.open_faults.clear()  # the admin made it readable (udev rule, a capability): the next reload sees it
    (pkg, *_) = backend.discover()
    assert "energy_why_not" not in pkg.info
    assert backend.sample().readings["powercap:package-0/energy"].status is Status.OK
    backend.close()


async def test_a_reload_probes_rapl_again(root, tmp_path, clock):
    """SIGHUP/aithermctl policy reload: an energy_uj made readable since start is read from the next tick."""
    from aithermd.runtime.daemon import Daemon
    from aithermd.settings import DaemonSettings
    from tests.support.stub_engine import STUB_ENGINE, write_policy

    write_policy(tmp_path / "policies", "balanced", 50.0)
    io = FaultIO()
    io.open_faults["intel-rapl:0/energy_uj"] = [OSError(errno.EACCES, "Permission denied")]
    settings = DaemonSettings(state_dir=tmp_path / "state", policy_dirs=[tmp_path / "policies"],
                              bus="none", metrics_listen="none", nvml=False, sysfs_root=root,
                              runtime_dir=tmp_path / "run")
    d = Daemon(settings, clock=clock, backends=[RaplBackend(str(root), clock=clock, io=io)],
               sleep=clock.sleep, engine=STUB_ENGINE)
    statuses = []

    def step():
        snap = d.hub.latest
        statuses.append(snap.readings["powercap:package-0/energy"].status)
        if snap.seq == 3:
            io.open_faults.clear()  # made readable (a udev rule, a capability)
        if snap.seq == 5:
            d.request_reload()
        return snap.seq >= 8

    assert await d.run(until=step) == 0
    assert statuses[:5] == [Status.NOT_SUPPORTED] * 5, "not probed every tick: only on reload"
    assert statuses[5:] == [Status.OK] * 3, "the tick after the reload reads it"


def test_a_subzone_stating_no_power_represents_the_gap_its_package_does(root):
    """core states no constraint power: at its package's 95 W its counter represents 2,759 s, not the 524 s
    of the absolute 500 W default (a 1,000 s gap of core was discarded, and after a daemon restart every
    downtime over 524 s left core unmeasured)."""
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    backend.discover()
    set_energy(root, 1_000_000_000)
    backend.sample()
    clock.advance(1000.0)
    set_energy(root, 61_000_000_000)  # the package 60 W, its core 30 W over the gap
    s = backend.sample().readings
    assert s["powercap:core/power"].value == pytest.approx(30.0)
    assert s["powercap:core/energy"].value == pytest.approx(500.0 + 30_000.0)
    backend.close()


def test_the_energy_reading_gives_the_raw_counter_of_the_last_counted_read(root):
    """What the meter saves to measure a downtime across a restart: the counter (J) behind the total, where
    it wraps (max_energy_range_uj + 1 µJ) and how long a gap it represents; a held read is not counted, so
    the counter stays the last counted one's."""
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    backend.discover()
    set_energy(root, 1_000_000_000)
    backend.sample()
    clock.advance(1.0)
    set_energy(root, 1_050_000_000)
    energy = backend.sample().readings["powercap:package-0/energy"]
    assert (energy.counter_j, energy.modulus_j) == (pytest.approx(1050.0), pytest.approx(262_143.328851))
    assert energy.max_gap_s == pytest.approx(262_143.32885 / 95.0)
    clock.advance(1.0)
    set_energy(root, 5_050_000_000)  # +4 kJ in a second on a 50 W package: held
    held = backend.sample().readings
    assert held["powercap:package-0/power"].status is Status.STALE
    assert (held["powercap:package-0/energy"].value, held["powercap:package-0/energy"].counter_j) == (
        pytest.approx(1050.0), pytest.approx(1050.0))
    backend.close()
