"""Checking a power budget from outside the daemon: after every tick, the limits the simulated machine has in
force are read from the machine itself (the fake NVML's power and enforced limits, the board's RAPL
``constraint_N_power_limit_uw`` files), added up — each GPU at the larger of its two limits, the CPU
package at the larger of PL1 and PL2, as the budget counts them — and compared with the budget the
daemon published. The daemon's own arithmetic is not trusted for this: only what reached the hardware.

:meth:`BudgetWatch.summary` gives the ticks checked, those over the budget, the most in force, and per
device the mean share the daemon allotted and the mean true draw; :func:`summary_lines` the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aithermd.model import Event, Snapshot

TOLERANCE_W = 0.5  # NVML limits are whole mW and RAPL µW: rounding, not excess


class BudgetWatch:
    """A hub listener over a :class:`~aithermd.sim.machine.SimulatedMachine` (see the module doc)."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine
        self.ticks = 0
        self.over = 0
        self.worst: tuple[float, float, float] | None = None  # (in force − budget, in force, t_s)
        self.first: dict[str, Any] | None = None
        self.budgets: dict[float, dict[str, Any]] = {}  # per budget in force: ticks, over, most in force
        self._allotted: dict[str, float] = {}
        self._drawn: dict[str, float] = {}
        self._asks: dict[str, float] = {}

    def in_force_w(self) -> dict[str, float]:
        """The limits in force now, per device id, read from the machine (W)."""
        m = self.machine
        out = {}
        for i in range(len(m.gpus)):
            limit = m.nvml.power_limit_w(i) or 0.0
            out[f"gpu{i}"] = max(limit, m.nvml.enforced_power_limit_w(i) or 0.0)
        pls = [f.read_int() for name, f in m.board.pl.items() if "intel-rapl:0/" in name]
        values = [v for v in pls if v]
        if values:
            out["powercap:package-0"] = max(values) / 1e6
        return out

    def __call__(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        report = snapshot.budget
        if not report:
            return
        if self.first is None:
            self.first = {k: report[k] for k in ("policy", "budget_w", "how", "wall_w", "other_w")}
        in_force = self.in_force_w()
        total = sum(in_force[d] for d in report["devices"] if d in in_force)
        budget = float(report["budget_w"])
        self.ticks += 1
        t_s = self.machine.t_s
        per = self.budgets.setdefault(budget, {"budget_w": budget, "how": report["how"], "ticks": 0, "over": 0,
                                               "max_in_force_w": 0.0})
        per["ticks"] += 1
        if report.get("short_w"):  # below the devices' lowest limits: the daemon said it cannot hold
            per["short_w"] = max(per.get("short_w", 0.0), float(report["short_w"]))
        per["max_in_force_w"] = round(max(per["max_in_force_w"], total), 1)
        if total > budget + TOLERANCE_W:
            self.over += 1
            per["over"] += 1
        if self.worst is None or total - budget > self.worst[0]:
            self.worst = (total - budget, total, t_s)
        m = self.machine
        truth = {f"gpu{i}": m.nvml.gpu(i).power_mw / 1000.0 for i in range(len(m.gpus))}
        truth["powercap:package-0"] = m.board.cpu_power_w
        for dev, entry in report["devices"].items():
            self._allotted[dev] = self._allotted.get(dev, 0.0) + float(entry["allotted_w"])
            self._asks[dev] = max(self._asks.get(dev, 0.0), float(entry["ask_w"]))
            self._drawn[dev] = self._drawn.get(dev, 0.0) + truth.get(dev, 0.0)

    def summary(self) -> dict[str, Any]:
        """``ticks`` checked, ``over`` (ticks whose limits in force passed the budget), ``max_in_force_w``
        and ``max_over_w`` (most in force, and by how much it passed the budget: ≤ 0 when held), ``budgets``:
        the same per budget in force (a policy's budgets switch with their ``when``), ``devices``: per device
        ``mean_allotted_w``, ``mean_drawn_w`` (true draw), ``max_ask_w``."""
        n = max(1, self.ticks)
        worst = self.worst or (0.0, 0.0, 0.0)
        return {**(self.first or {}), "ticks": self.ticks, "over": self.over,
                "max_in_force_w": round(worst[1], 1), "max_over_w": round(worst[0], 1),
                "at_t_s": round(worst[2], 1), "budgets": list(self.budgets.values()),
                "devices": {d: {"mean_allotted_w": round(v / n, 1), "mean_drawn_w": round(self._drawn[d] / n, 1),
                                "max_ask_w": round(self._asks[d], 1)} for d, v in self._allotted.items()}}


def summary_lines(b: dict[str, Any]) -> list[str]:
    """The summary's budget section (``b``: :meth:`BudgetWatch.summary`)."""
    held = "held at every tick" if b["over"] == 0 else f"EXCEEDED at {b['over']} ticks"
    lines = ["", f"power budget ({b.get('policy')}): {held} — {b['ticks']} ticks checked against the limits in "
             "force on the machine (GPU power/enforced limit, CPU PL1/PL2)"]
    for per in b.get("budgets") or ():
        lines.append(f"  {per['ticks']:>6} ticks at {per['how']}: most in force {per['max_in_force_w']:.0f} W"
                     + (f", over at {per['over']} ticks" if per["over"] else "")
                     + (f" (it is {per['short_w']:.0f} W below the devices' lowest limits: it cannot hold)"
                        if per.get("short_w") else ""))
    lines.append(f"  {'device':<20}{'mean share W':>14}{'mean drawn W':>14}{'rule asks W':>13}")
    for dev, d in b["devices"].items():
        lines.append(f"  {dev:<20}{d['mean_allotted_w']:>14.0f}{d['mean_drawn_w']:>14.0f}{d['max_ask_w']:>13.0f}")
    return lines
