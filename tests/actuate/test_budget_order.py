"""The apply path under a power budget: a limit raised on an inline backend (RAPL) waits for the limits cut on
a threaded one (NVML) in the same apply, and is left for the next tick when they are late: what is in force
never adds up to more than the budget, even for one tick (a simulated 4-GPU budget run on a loaded machine
saw 1 of 1200 ticks over, tests/sim/test_budget.py)."""

from __future__ import annotations

import asyncio

from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal
from aithermd.model import Decision, Knob, KnobKind, KnobValue, Layer
from tests.support.executor import InstantWorker, KnobWorld

GPU, PL1 = "gpu0/power_limit", "powercap:package-0/pl1"
ORDER: list[tuple[str, float]] = []


class Limits:
    """A backend of power limits (W) that records each write in the shared ORDER."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def locator(self) -> dict:
        return {"kind": "test"}

    def save_knob(self, knob_id: str) -> dict:
        return {"w": self.values[knob_id]}

    def write_knob(self, knob_id: str, value: float) -> None:
        ORDER.append((knob_id, value))
        self.values[knob_id] = value

    def read_knob(self, knob_id: str) -> KnobValue:
        return KnobValue(knob_id, self.values[knob_id])




def _run(tmp_path, late: bool):
    ORDER.clear()
    nvml, rapl = Limits({GPU: 300.0}), Limits({PL1: 100.0})
    knobs = {GPU: Knob(GPU, "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 450.0, 450.0, True),
             PL1: Knob(PL1, "powercap:package-0", KnobKind.PL1, "W", 10.0, 250.0, 125.0, True)}
    world = KnobWorld(knobs, {GPU: nvml, PL1: rapl}, (rapl,))
    executor = Executor(Applier(Journal(tmp_path / "state")), InstantWorker(late))
    current = {GPU: KnobValue(GPU, 300.0), PL1: KnobValue(PL1, 100.0)}
    wanted = [(GPU, Decision(GPU, 200.0, Layer.POLICY, "p/budget")),  # 100 W moved from the GPU ...
              (PL1, Decision(PL1, 200.0, Layer.POLICY, "p/budget"))]  # ... to the CPU package
    return asyncio.run(executor.apply(world, wanted, current=current, t_wall=1.0)), rapl


def test_a_raise_is_written_after_the_cut_it_is_paid_by(tmp_path):
    out, _ = _run(tmp_path, late=False)
    assert ORDER == [(GPU, 200.0), (PL1, 200.0)] and out.late == []


def test_a_raise_waits_for_the_next_tick_when_the_cut_is_late(tmp_path):
    out, rapl = _run(tmp_path, late=True)
    assert ORDER == [] and rapl.values[PL1] == 100.0  # 300 + 200 W would have been in force
    assert sorted(out.late) == [GPU, PL1]
