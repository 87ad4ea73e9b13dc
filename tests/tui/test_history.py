"""The plotted history: seeded from GetHistory, extended per snapshot, trimmed to its horizon."""

from fake_client import load

from aithermctl.history import History, plotted_ids


def test_loads_get_history_and_windows_by_time():
    h = History(horizon_s=600)
    h.load(load("history.json"))  # 4 minutes of the simulated workstation, one snapshot a second
    assert len(h.t) == 241
    last_minute = h.window("gpu0/power_limit", 60)
    assert len(last_minute) == 61 and {v for _, v in last_minute} == {360.0}
    assert h.window("gpu0/power_limit", 300)[0] == (1_767_268_800.0, 450.0)  # the default before the hold
    assert h.window("powercap:package-0/power", 300)[0][1] is None  # no value (the first read) is a gap
    assert h.window("nope", 60) == []


def test_append_extends_every_series_and_adds_new_ones(snapshot_doc):
    h = History(horizon_s=600)
    h.load({"t": [100.0, 101.0], "series": {"gpu0/power": [10, 20], "gone/power": [1, 2]}})
    h.append(102.0, snapshot_doc)
    assert list(h.series["gpu0/power"]) == [10.0, 20.0, 360.0]
    assert list(h.series["gone/power"]) == [1.0, 2.0, None]
    assert list(h.series["gpu1/power_limit"]) == [None, None, 240.0]
    assert list(h.series["powercap:package-0/pl1"]) == [None, None, 95.0]
    h.append(102.0, snapshot_doc)  # same time again: ignored
    assert len(h.t) == 3


def test_trims_to_the_horizon(snapshot_doc):
    h = History(horizon_s=10)
    for i in range(30):
        h.append(1000.0 + i, snapshot_doc)
    assert h.t[0] == 1019.0 and len(h.series["gpu0/temperature"]) == 11


def test_plotted_ids_are_gpu_and_package_series(snapshot_doc):
    ids = plotted_ids(snapshot_doc)
    assert ids["gpu0/temperature"] == 56.0 and ids["gpu0/power_limit"] == 360.0
    # a GPU's first fan and memory controller are plotted on a tall screen; board fans are not
    assert ids["gpu0/fan0"] is not None and ids["gpu0/memory_utilization"] == 60.0
    assert "gpu0/fan1" not in ids and "hwmon:nct6798-isa-0290/fan1" not in ids
