"""A hung read of one RAPL zone's file holds that zone only (attack13 A5): each zone is a device of the
read guard. A hung read of package-0's ``constraint_0_power_limit_uw`` quarantined the whole powercap
backend, so ``powercap:core`` was held too ("its chip does not answer") and its critical cut was dropped.

The hung read blocks on an event the test sets once the guard gave up on it (no wall-clock figure); the
guard's back-off clock is fake."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from aithermd.backends.guard import ReadGuard
from aithermd.backends.powercap import RaplBackend
from aithermd.clock import RealClock
from aithermd.model import Status
from aithermd.runtime.sampling import Sampler
from tests.support.machines import copy_machine

from .test_read_slow import SlowIO, until

PACKAGE, CORE = "powercap:package-0", "powercap:core"


def test_a_hung_limit_read_of_one_zone_holds_that_zone_only(tmp_path):
    root = copy_machine(tmp_path, "node-exporter-sys-class-powercap-intel-rapl.ttar")
    io = SlowIO("intel-rapl:0/constraint_0_power_limit_uw")
    rapl = RaplBackend(str(root), io=io)
    chans = [c.id for d in rapl.discover() for c in d.channels]
    guard = ReadGuard(deadline_s=0.1, clock=lambda: 0.0)
    sampler = Sampler(RealClock(), worker=None)
    sampler.guard.close()
    sampler.guard = guard
    world = SimpleNamespace(inline=(rapl,), device_owner={PACKAGE: rapl, CORE: rapl})

    def tick():
        got = asyncio.run(guard.sample([rapl], lambda b: b.sample(), lambda b: chans, time.monotonic))
        return got[0]
    try:
        assert tick().readings[f"{CORE}/energy"].status is Status.OK
        io.slow = True
        s = tick()
        assert guard.hangs == 1
        assert not guard.held(rapl)  # not the backend whole
        assert set(sampler.hung(world)) == {PACKAGE}  # core still answers: written (its critical cut)
        assert s.readings[f"{PACKAGE}/power"].status is Status.STALE
        assert s.readings[f"{CORE}/energy"].status is Status.OK  # read at this tick, after the hung zone
        assert s.knobs[f"{CORE}/pl1"].status is Status.OK
        s = tick()  # the next pass skips the hung zone and reads the other
        assert guard.hangs == 1 and s.readings[f"{CORE}/energy"].status is Status.OK
        assert s.readings[f"{PACKAGE}/energy"].status is Status.STALE
        assert s.knobs[f"{PACKAGE}/pl1"].status is Status.STALE
        io.answer.set()
        until(lambda: PACKAGE not in rapl.skip, "the read returned")
        io.slow = False
        s = tick()
        assert s.readings[f"{PACKAGE}/energy"].status is Status.OK
        assert s.knobs[f"{PACKAGE}/pl1"].value == 4090.0
    finally:
        io.slow = False
        io.answer.set()
        guard.close()
        rapl.close()
