"""A power limit the driver keeps its own way is not rewritten every tick (attack report F8): the applier
over the NVML backend over the fake NVML, whose driver keeps the limit in 25 W steps or not under a floor
above the minimum it reports (the set call succeeds, the read-back differs). A safety cut was written
again every tick, with an info line and an event each time."""

from __future__ import annotations

import pytest

from aithermd.actuate.applier import Applier
from aithermd.actuate.journal import Journal
from aithermd.backends.nvml import NvmlBackend
from aithermd.model import Decision, Layer
from aithermd.policy.arbiter import CEILING_RULE
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import RTX4090, profile

CUT = Decision("gpu0/power_limit", 229.11, Layer.SAFETY, "safety/critical-temperature")
SET = "nvmlDeviceSetPowerManagementLimit"


@pytest.fixture
def rig(tmp_path):
    fake = FakeNvml([profile(RTX4090)], fan_count=[1])  # 150–450 W, 450 W in force
    backend = NvmlBackend(nvml=fake.bindings())
    (gpu,) = backend.discover()
    knob = next(k for k in gpu.knobs if k.id == "gpu0/power_limit")
    yield fake, backend, knob, Applier(Journal(tmp_path))
    backend.close()


def ticks(rig, decision: Decision, value: float, n: int) -> tuple[int, list[str]]:
    """``n`` ticks applying ``value``: (set calls made, kinds of the events)."""
    fake, backend, knob, applier = rig
    before, kinds = fake.calls.get(SET, 0), []
    for t in range(n):
        _, events = applier.apply(backend, knob, "gpu0", decision, value, backend.read_knob(knob.id), float(t))
        kinds += [e.kind for e in events]
    return fake.calls.get(SET, 0) - before, kinds


def test_a_safety_cut_the_driver_keeps_below_its_target_holds(rig):
    fake = rig[0]
    fake.quantise_power(0, step_w=25.0)
    writes, kinds = ticks(rig, CUT, 229.11, 30)
    assert fake.power_limit_w(0) == 225.0  # under the target: at least as safe
    assert writes == 1 and kinds == ["actuation", "drift"], "written once, its rounding said once"


def test_a_limit_the_driver_keeps_above_its_target_is_not_rewritten_until_it_moves(rig):
    fake = rig[0]
    fake.quantise_power(0, floor_w=250.0)  # reports 150 W as its minimum, keeps nothing under 250 W
    cut = Decision("gpu0/power_limit", 150.0, Layer.SAFETY, "safety/critical-temperature")
    writes, kinds = ticks(rig, cut, 150.0, 30)
    assert fake.power_limit_w(0) == 250.0 and writes == 1 and kinds == ["actuation", "drift"]
    fake.gpus[0].limit_mw = 400_000  # changed behind our back: the cut holds no more and is written again
    writes, _ = ticks(rig, cut, 150.0, 5)
    assert writes == 1 and fake.power_limit_w(0) == 250.0


def test_a_safety_cut_still_written_when_the_limit_is_above_its_target(rig):
    fake = rig[0]
    fake.quantise_power(0, step_w=25.0)
    ticks(rig, CUT, 229.11, 1)
    fake.gpus[0].limit_mw = 300_000  # raised behind our back, above the cut
    writes, _ = ticks(rig, CUT, 229.11, 3)
    assert writes == 1 and fake.power_limit_w(0) == 225.0


def test_the_release_ramps_ceiling_above_the_limit_in_force_is_written(rig):
    """A ceiling is not a cut (policy/safety_ramp.py): a limit under it does not hold it, or the limit cut
    by a critical temperature would never rise again (the ceiling's steps were dropped as "kept")."""
    fake = rig[0]
    ticks(rig, CUT, 229.11, 1)
    step = Decision("gpu0/power_limit", 251.61, Layer.SAFETY, CEILING_RULE)
    writes, kinds = ticks(rig, step, 251.61, 5)
    assert writes == 1 and abs(fake.power_limit_w(0) - 251.61) < 0.01 and kinds == ["actuation"]
