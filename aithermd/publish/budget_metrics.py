"""Prometheus families of the node power budget, rendered from the last snapshot's ``budget`` report
(:mod:`aithermd.policy.power_budget`); nothing while no budget is in force.

- ``aithermd_power_budget_watts{policy, scope}``: the budget — ``scope="devices"`` for the GPUs and CPU
  packages (W DC), ``scope="wall"`` at the wall (W AC) when the policy gives one;
- ``aithermd_power_budget_allotted_watts{device}``: the limit the budget sets for each device (W; a CPU
  package's PL2), the limit in force for a device it only counts;
- ``aithermd_power_budget_drawn_watts{device}``: the mean draw the split used (W);
- ``aithermd_power_budget_wall_drawn_watts``: the draw at the wall that implies: (devices' draw +
  ``other_w``) / PSU efficiency (W AC, an estimate: nothing measures the wall).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aithermd.publish.textfam import PROM, TextCollector


class BudgetCollector(TextCollector):
    """Renders ``hub.latest.budget`` (see the module doc)."""

    def __init__(self, hub: Any) -> None:
        self._hub = hub

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        snapshot = self._hub.latest
        report = getattr(snapshot, "budget", None) if snapshot is not None else None
        if not report:
            return
        budget = f.gauge("aithermd_power_budget_watts", "Node power budget in force (W): scope "
                         "devices = GPUs and CPU packages (DC), wall = at the wall (AC).",
                         labels=["policy", "scope"])
        budget.add_metric([str(report["policy"]), "devices"], float(report["budget_w"]))
        if report.get("wall_w") is not None:
            budget.add_metric([str(report["policy"]), "wall"], float(report["wall_w"]))
        allotted = f.gauge("aithermd_power_budget_allotted_watts",
                           "Power limit the budget allots each device (W).", labels=["device"])
        drawn = f.gauge("aithermd_power_budget_drawn_watts",
                        "Mean draw of each device the budget split used (W).", labels=["device"])
        for device, entry in report.get("devices", {}).items():
            allotted.add_metric([device], float(entry["allotted_w"]))
            if entry.get("drawn_w") is not None:
                drawn.add_metric([device], float(entry["drawn_w"]))
        yield from (budget, allotted, drawn)
        if report.get("wall_drawn_w") is not None:
            wall = f.gauge("aithermd_power_budget_wall_drawn_watts",
                           "Estimated draw at the wall: (devices' draw + other_w) / PSU efficiency (W).")
            wall.add_metric([], float(report["wall_drawn_w"]))
            yield wall
