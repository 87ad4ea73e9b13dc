"""A job's own progress rate (``ReportProgress``) reaches the engine as a ``gpu<N>/progress_rate`` reading,
for as long as the job keeps reporting."""

from __future__ import annotations

import dataclasses

from aithermd.backends.nvml import NvmlBackend
from aithermd.runtime.daemon import Daemon
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import RTX4090, profile
from tests.support.stub_engine import STUB_ENGINE


async def test_reported_progress_is_a_reading_of_the_next_ticks_until_it_goes_stale(settings, clock):
    seen: list[float | None] = []

    def evaluate(active, holds, inp, state, overrides):
        reading = inp.readings.get("gpu0/progress_rate")
        seen.append(None if reading is None else reading.value)
        return STUB_ENGINE.evaluate(active, holds, inp, state, overrides)

    engine = dataclasses.replace(STUB_ENGINE, evaluate=evaluate)
    fake = FakeNvml([profile(RTX4090)], fan_count=1, driver_version="590.48.01")
    d = Daemon(settings, clock=clock, backends=[NvmlBackend(nvml=fake.bindings())], sleep=clock.sleep,
               engine=engine)

    def step(_t):
        if len(seen) == 1:
            d.control.report_progress(["gpu0"], 2.5)
        if len(seen) == 3:
            clock.advance(40.0)  # the job went quiet (from the tick after this one on)

    d.before_sample = step
    assert await d.run(max_ticks=5) == 0
    assert seen[0] is None and seen[1:3] == [2.5, 2.5] and seen[-1] is None
