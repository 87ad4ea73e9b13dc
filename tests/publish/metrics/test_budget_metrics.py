"""The power budget's metrics, rendered from what the budget stage really reports (the engine over the
budget tests' plant): the budget at the wall and for the devices, each device's allotted limit and draw,
the estimated draw at the wall; no series while no budget is in force."""

from __future__ import annotations

from dataclasses import replace

import pytest
from metrics_helpers import handle_with, names, scrape, value

from aithermd.publish.reference import reference_snapshot
from tests.policy.machines import PKG
from tests.policy.test_budget import RAISE, Plant, policy


def test_budget_allotted_and_drawn_are_exposed_per_device():
    plant = Plant(2, demand_w=300.0)
    pol = policy("budget: {wall_w: 1000, psu_efficiency: 0.9, other_w: 75}\n" + RAISE, name="ws")
    for _ in range(15):
        report = plant.step(pol).budget
    _, handle = handle_with(replace(reference_snapshot(1), budget=report))
    found = scrape(handle)
    assert value(found, "aithermd_power_budget_watts", policy="ws", scope="devices") == report["budget_w"] == 825.0
    assert value(found, "aithermd_power_budget_watts", policy="ws", scope="wall") == 1000.0
    for dev in ("gpu0", "gpu1", PKG):
        entry = report["devices"][dev]
        assert value(found, "aithermd_power_budget_allotted_watts", device=dev) == entry["allotted_w"]
        assert value(found, "aithermd_power_budget_drawn_watts", device=dev) == entry["drawn_w"]
    allotted = sum(value(found, "aithermd_power_budget_allotted_watts", device=d) for d in ("gpu0", "gpu1", PKG))
    assert allotted <= 825.0
    drawn = sum(report["devices"][d]["drawn_w"] for d in ("gpu0", "gpu1", PKG))
    assert value(found, "aithermd_power_budget_wall_drawn_watts") == pytest.approx((drawn + 75.0) / 0.9, abs=0.1)


def test_no_budget_series_without_a_budget():
    _, handle = handle_with(reference_snapshot(1))
    assert not {n for n in names(scrape(handle)) if n.startswith("aithermd_power_budget")}
