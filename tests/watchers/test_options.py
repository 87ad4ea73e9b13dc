"""Which services the daemon runs beside the loop (WatcherOptions.for_daemon)."""

from __future__ import annotations

import pytest

from aithermd.settings import DaemonSettings
from aithermd.watchers.options import WatcherOptions


@pytest.fixture
def machine(tmp_path):
    sys_dir = tmp_path / "sys"
    sys_dir.mkdir()
    return str(sys_dir.resolve())


def opts(machine, root, bus="system", tick_s=1.0, real_time=True) -> WatcherOptions:
    settings = DaemonSettings(sysfs_root=root, bus=bus, tick_s=tick_s)
    return WatcherOptions.for_daemon(settings, real_time, machine_sysfs=machine)


@pytest.mark.parametrize("bus, want", [("system", "system"), ("session", "system"), ("none", "system"),
                                       ("unix:path=/run/x", "unix:path=/run/x")])
def test_on_the_machine_logind_is_watched_whatever_bus_the_daemon_serves_on(machine, bus, want):
    o = opts(machine, machine, bus)
    assert o.hotplug and o.udev and o.logind_bus == want and o.fastlane is not None


@pytest.mark.parametrize("bus, want", [("system", "system"), ("none", None), ("session", None),
                                       ("unix:path=/run/x", "unix:path=/run/x")])
def test_a_fixture_tree_has_no_hotplug_and_logind_only_where_asked(machine, tmp_path, bus, want):
    o = opts(machine, tmp_path / "fixture", bus)
    assert not o.hotplug and o.logind_bus == want


def test_simulated_time_runs_no_service(machine):
    assert opts(machine, machine, real_time=False) == WatcherOptions()


@pytest.mark.parametrize("tick_s, lane", [(0.1, False), (0.2, True), (5.0, True)])
def test_the_fast_lane_runs_when_the_tick_is_slower_than_10_hz(machine, tick_s, lane):
    assert (opts(machine, machine, tick_s=tick_s).fastlane is not None) is lane
