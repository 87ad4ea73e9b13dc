"""A chip slow only at every other read (attack13 A4): its back-off is reached, and grows, whatever the
passes' numbers. Before, whether such a chip was held depended on how the read-ahead numbered the
passes: nct6798 and k10temp reached the 10 s hold but forgot it at the one read in time after it (never
doubled, ~12 log lines/s for ever); the amdgpu hwmon backend (read whole) was forgotten at every in-time
pass and never held. Now the overruns are counted among the device's last reads, and a hold that
follows one doubles.

Through the real ReadGuard (fake back-off clock) and HwmonBackend; the slow read blocks on an event the test
sets after the pass (no wall-clock figure)."""

from __future__ import annotations

import asyncio
import threading
import time

from aithermd.backends.guard import ReadGuard
from aithermd.backends.hangs import BACKOFF_S, HUNG_PASSES, WINDOW
from aithermd.model import Reading, Sample

from .test_read_slow import NCT, Rig, SlowIO, until


class AltIO(SlowIO):
    """While ``slow``, every other read of the file (1st, 3rd, ...) answers only once ``answer`` is set."""

    n = 0

    def pread(self, fd: int, size: int) -> bytes:
        if self.slow and self._paths.get(fd, "").endswith(self.suffix):
            self.n += 1
            if self.n % 2:
                self.answer.wait(30)
        return super(SlowIO, self).pread(fd, size)


def flap_until_held(guard, tick, release, held) -> int:
    """Tick (releasing each slow read once the guard gave up on it) until ``held()``; → the ticks it took."""
    for n in range(1, 4 * WINDOW):
        hangs = guard.hangs
        tick()
        if guard.hangs > hangs:
            release()
        if held():
            return n
    raise AssertionError("never held")


def test_a_chip_slow_every_other_read_is_held_and_its_back_off_doubles(tmp_path):
    rig = Rig(tmp_path)
    rig.io.__class__, rig.io.n = AltIO, 0  # the rig's SlowIO, slow at every other read
    held = lambda: rig.hwmon.skip.get(NCT, "").startswith("read slow")  # noqa: E731
    try:
        rig.tick()
        rig.io.slow = True
        assert flap_until_held(rig.guard, rig.tick, rig.returned, held) <= 2 * HUNG_PASSES
        assert rig.hwmon.skip[NCT].endswith(f"read again in {BACKOFF_S:g} s")
        for backoff in (2 * BACKOFF_S, 4 * BACKOFF_S):
            rig.now[0] += backoff / 2  # the last back-off is over
            assert flap_until_held(rig.guard, rig.tick, rig.returned, held) <= WINDOW + 1
            assert rig.hwmon.skip[NCT].endswith(f"read again in {backoff:g} s")  # not 10 s again
    finally:
        rig.close()


class Flappy:
    """A backend without a ``Quarantine`` whose every other sample answers only once ``answer`` is set."""

    kind = "hwmon-gpu"

    def __init__(self) -> None:
        self.slow, self.n, self.answer = False, 0, threading.Event()

    def sample(self) -> Sample:
        self.n += 1
        if self.slow and self.n % 2:
            self.answer.wait(30)
        return Sample(0.0, {"gpu0/temp": Reading("gpu0/temp", 50.0)})


def test_a_backend_read_whole_slow_every_other_read_is_held(tmp_path):
    now = [0.0]
    guard = ReadGuard(deadline_s=0.1, clock=lambda: now[0])
    gpu = Flappy()

    def tick():
        asyncio.run(guard.sample([gpu], lambda b: b.sample(), lambda b: ["gpu0/temp"], time.monotonic))

    def release():
        gpu.answer.set()
        until(lambda: id(gpu) not in guard._busy or guard.slow(gpu), "the read returned")
        gpu.answer.clear()
    try:
        tick()
        gpu.slow = True
        assert flap_until_held(guard, tick, release, lambda: guard.slow(gpu)) <= 2 * HUNG_PASSES
        reads = gpu.n
        tick()
        assert gpu.n == reads  # held: not read, the tick not held up
    finally:
        gpu.slow = False
        gpu.answer.set()
        guard.close()
