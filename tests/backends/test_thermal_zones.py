"""Thermal zones from the recorded procfs and node_exporter trees: ids, trips, values and fault isolation."""

from __future__ import annotations

import errno
import os

import pytest

from aithermd.backends.thermal import ThermalBackend
from aithermd.model import DeviceKind, Status
from aithermd.sim import ttar

from .faults import FaultIO
from .helpers import TTAR


@pytest.fixture
def procfs_root(tmp_path):
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
    return tmp_path / "fixtures" / "sys"


def open_zones(root, io=None):
    backend = ThermalBackend(str(root), io=io)
    return backend, backend.discover()


def test_zones_are_temperature_sources_named_by_type(procfs_root):
    backend, devices = open_zones(procfs_root)
    sample = backend.sample()
    backend.close()
    assert [(d.id, d.kind, d.name, d.channels[0].label) for d in devices] == [
        ("thermal:bcm2835_thermal", DeviceKind.THERMAL, "bcm2835_thermal", "bcm2835_thermal"),
        ("thermal:acpitz", DeviceKind.THERMAL, "acpitz", "acpitz")]
    assert sample.readings["thermal:bcm2835_thermal/temp"].value == 49.925
    assert sample.readings["thermal:acpitz/temp"].value == -44.0


def test_node_exporter_zone_and_twins_get_numbered(tmp_path):
    ttar.extract(TTAR / "node-exporter-sys-hwmon-thermal-powercap.ttar", tmp_path)
    root = tmp_path / "sys"
    zones = root / "devices/virtual/thermal"
    os.symlink("thermal_zone0", zones / "thermal_zone7")  # a second zone of the same type, later in boot
    os.symlink("../../devices/virtual/thermal/thermal_zone7", root / "class/thermal/thermal_zone7")
    backend, devices = open_zones(root)
    backend.close()
    assert [d.id for d in devices] == ["thermal:cpu-thermal", "thermal:cpu-thermal#2"]


def test_trip_points_become_thresholds_and_sentinel_trips_are_dropped(procfs_root):
    zone = procfs_root / "class/thermal/thermal_zone1"
    for n, (kind, temp) in enumerate([("critical", "105000"), ("passive", "95000"), ("hot", "127000"),
                                      ("active", "-273200")]):
        (zone / f"trip_point_{n}_type").write_text(kind + "\n")
        (zone / f"trip_point_{n}_temp").write_text(temp + "\n")
    backend, devices = open_zones(procfs_root)
    backend.close()
    assert dict(devices[1].channels[0].thresholds) == {"crit": 105.0, "passive": 95.0}


@pytest.mark.parametrize(("fault", "status", "lost"), [
    (OSError(errno.EIO, "Input/output error"), Status.FAILED, False),
    (OSError(errno.ENODEV, "No such device"), Status.FAILED, True),
    (b"127000\n", Status.IMPLAUSIBLE, False),
    (b"49", Status.IMPLAUSIBLE, False)])
def test_one_failing_zone_never_blanks_the_others(procfs_root, fault, status, lost):
    io = FaultIO()
    io.faults["thermal_zone1/temp"] = [fault]
    backend, _ = open_zones(procfs_root, io)
    sample = backend.sample()
    backend.close()
    assert sample.readings["thermal:acpitz/temp"].status == status
    assert sample.readings["thermal:acpitz/temp"].value is None
    assert sample.readings["thermal:bcm2835_thermal/temp"].value == 49.925
    assert sample.lost == (frozenset({"thermal:acpitz"}) if lost else frozenset())
