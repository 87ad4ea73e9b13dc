"""The plotted history: seeded from GetHistory, extended per snapshot, trimmed to its horizon."""

from fake_client import load

from aithermctl.history import History, plotted_ids


def test_loads_get_history_and_windows_by_time():
    h = History(horizon_s=600)
    h.load(load("history.json"))  # 4 minutes of the simulated workstation, one snapshot a second
    assert len(h.t) == 241
    last_minute = h.window("gpu0/power_limit", 60, knob=True)
    assert len(last_minute) == 61 and {v for _, v in last_minute} == {360.0}
    assert h.window("gpu0/power_limit", 300, knob=True)[0] == (1_767_268_800.0, 450.0)  # the default before
    assert h.window("gpu0/power_limit", 60) == []  # a knob, not a channel
    assert h.window("powercap:package-0/power", 300)[0][1] is None  # no value (the first read) is a gap
    assert h.window("nope", 60) == []


def test_append_extends_every_series_and_adds_new_ones(snapshot_doc):
    h = History(horizon_s=600)
    h.load({"t": [100.0, 101.0], "series": {"gpu0/power": [10, 20], "gone/power": [1, 2]}, "units": {},
            "knobs": {"gpu0/power_limit": [300, 310]}, "knob_units": {}})
    h.append(102.0, snapshot_doc)
    gpu0 = next(d for d in snapshot_doc["devices"] if d["id"] == "gpu0")
    power = next(c["value"] for c in gpu0["channels"] if c["id"] == "gpu0/power")
    assert list(h.series["gpu0/power"]) == [10.0, 20.0, power]
    assert list(h.series["gone/power"]) == [1.0, 2.0, None]
    assert list(h.knobs["gpu0/power_limit"]) == [300.0, 310.0, 360.0]
    assert list(h.knobs["gpu1/power_limit"]) == [None, None, 240.0]
    assert list(h.knobs["powercap:package-0/pl1"]) == [None, None, 95.0]
    h.append(102.0, snapshot_doc)  # same time again: ignored
    assert len(h.t) == 3


def test_trims_to_the_horizon(snapshot_doc):
    h = History(horizon_s=10)
    for i in range(30):
        h.append(1000.0 + i, snapshot_doc)
    assert h.t[0] == 1019.0 and len(h.series["gpu0/temperature"]) == 11 and len(h.knobs["gpu0/fan0"]) == 11


def test_plotted_ids_are_gpu_and_package_series(snapshot_doc):
    ids, knobs = plotted_ids(snapshot_doc)
    gpu0 = next(d for d in snapshot_doc["devices"] if d["id"] == "gpu0")
    reading = {c["id"]: c["value"] for c in gpu0["channels"]}
    assert ids["gpu0/temperature"] == reading["gpu0/temperature"] and knobs["gpu0/power_limit"] == 360.0
    assert "gpu0/power_limit" not in ids and "gpu0/temperature" not in knobs
    # a GPU's first fan and memory controller are plotted on a tall screen; board fans are not
    assert ids["gpu0/memory_utilization"] == reading["gpu0/memory_utilization"] is not None
    assert "gpu0/fan1" not in ids and "hwmon:nct6798-isa-0290/fan1" not in ids


def test_a_gpu_fans_speed_and_the_duty_asked_of_it_stay_two_series(snapshot_doc):
    """NVML's fan reading and its knob share the id gpu0/fan0: one must not overwrite the other."""
    gpu0 = next(d for d in snapshot_doc["devices"] if d["id"] == "gpu0")
    next(c for c in gpu0["channels"] if c["id"] == "gpu0/fan0")["value"] = 47.0  # the fan turns at 47 %
    next(k for k in gpu0["knobs"] if k["id"] == "gpu0/fan0")["value"] = 30.0  # of the 30 % asked
    ids, knobs = plotted_ids(snapshot_doc)
    assert (ids["gpu0/fan0"], knobs["gpu0/fan0"]) == (47.0, 30.0)
    h = History(horizon_s=600)
    h.load({"t": [100.0], "series": {"gpu0/fan0": [45.0]}, "units": {"gpu0/fan0": "%"},
            "knobs": {"gpu0/fan0": [30.0]}, "knob_units": {"gpu0/fan0": "%"}})
    h.append(101.0, snapshot_doc)
    assert h.window("gpu0/fan0", 60) == [(100.0, 45.0), (101.0, 47.0)]
    assert h.window("gpu0/fan0", 60, knob=True) == [(100.0, 30.0), (101.0, 30.0)]
