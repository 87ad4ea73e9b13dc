"""One tick runs sample → health → evaluate → arbitrate → actuate (journal first, write, read back) → publish,
and the snapshot it publishes already holds the values read back after this tick's writes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aithermd.actuate.journal import Journal
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


async def test_one_tick_in_order_and_the_snapshot_holds_the_read_back(settings, clock):
    steps: list[str] = []
    b = FakeBackend(start_pwm=100, start_enable=2)
    real_sample, real_read = b.sample, b.read_knob

    def sample():
        steps.append("sample")
        return real_sample()

    def read_knob(knob_id):
        steps.append(f"read {knob_id.rsplit('/', 1)[1]}")
        return real_read(knob_id)

    def evaluate(*args, **kwargs):
        steps.append("evaluate")
        return STUB_ENGINE.evaluate(*args, **kwargs)

    b.sample, b.read_knob = sample, read_knob  # type: ignore[method-assign]
    def on_write(knob_id, value):
        on_disk = knob_id in Journal(settings.state_dir)
        steps.append(f"write {knob_id.rsplit('/', 1)[1]}" + (" journaled" if on_disk else ""))

    b.on_write = on_write
    engine = replace(STUB_ENGINE, evaluate=evaluate)
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=engine)
    published = []
    d.hub.add_listener(lambda snap, events: (steps.append(f"publish {snap.seq}"), published.append(snap)))
    assert await d.run(max_ticks=2) == 0
    assert steps == ["sample", "evaluate", "write pwm1 journaled", "read pwm1", "write pwm2 journaled",
                     "read pwm2", "publish 1",
                     "sample", "evaluate", "publish 2"]  # tick 2: the fans hold 60 %, no-ops dropped
    first = published[0]
    assert first.knobs[b.kid("pwm1")].value == pytest.approx(60.0, abs=0.3)
    assert first.knobs[b.kid("pwm1")].mode == "manual"  # sampled in auto before the write; read back after
