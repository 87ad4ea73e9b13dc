"""A *slow* GPU on the read guard's thread (attack11 G1): every NVML call on it answers, each under the
per-call deadline, so it is never hung, yet its whole read took seconds and held the event loop (and every
other GPU's reading, the safety layer, SIGTERM) for all of it, at every tick. Now a GPU's read has a budget:
past it the GPU is held hung (its readings stale, its knobs refused: a write to a GPU that slow would hold up
the worker and the other GPUs' safety writes behind it), the other GPU is read at the same tick, and a GPU
that overran at each of its last passes is held so for a back-off (not read at all), then read again.

The fake NVML's calls on the slow GPU wait on an Event for ``CALL_S`` each (set after the pass: the read left
behind then ends at once); the back-off runs on a fake clock. Nothing here asserts a wall-clock time."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aithermd.backends.guard import ReadGuard
from aithermd.backends.hangs import BACKOFF_S, HUNG_PASSES
from aithermd.backends.nvml import NvmlBackend
from aithermd.clock import FakeClock
from aithermd.errors import BackendTimeout
from aithermd.model import Status
from tests.backends.nvml.conftest import two

DEADLINE_S = 0.3  # per NVML call, and (by default) the budget of a GPU's whole read
CALL_S = 0.2  # each call on the slow GPU: under the deadline; a read is a dozen calls, seconds in all


class SlowCalls:
    """In the fake's gate slot of one GPU (``FakeNvml._hangs``, what ``hang()`` puts there): each call on it
    takes ``CALL_S`` until :meth:`open`; ``calls`` counts them."""

    def __init__(self) -> None:
        self.calls, self._fast = 0, threading.Event()

    def wait(self) -> None:
        self.calls += 1
        self._fast.wait(CALL_S)

    def open(self) -> None:
        self._fast.set()

    set = open  # FakeNvml.unhang() sets what it pops

    def arm(self) -> None:
        self._fast = threading.Event()


@pytest.fixture
def rig(backend_over):
    fake, clock = two(), FakeClock()
    backend = backend_over(fake, clock=clock, read_deadline_s=DEADLINE_S)
    guard = ReadGuard(deadline_s=5.0, clock=clock.monotonic)  # the pass's deadline does not apply: the GPU's
    slow = SlowCalls()
    fake._hangs[0] = slow  # noqa: SLF001 - the fake's own seam for a GPU's calls (hang())
    yield fake, clock, backend, guard, slow
    fake.unhang()
    guard.close()


def sample(guard: ReadGuard, backend: NvmlBackend):
    channels = [c.id for d in backend.devices() for c in d.channels]
    (got,) = asyncio.run(guard.sample([backend], lambda b: b.sample(), lambda b: channels,
                                      backend.clock.monotonic, lambda b: 30.0))
    return got


def returned(backend: NvmlBackend) -> None:
    """Wait (real time, polled) until the read of gpu0 left behind has returned: its GPU let go, or held for
    a back-off."""
    tick = threading.Event()
    for _ in range(200):
        why = backend.skip.get("gpu0")
        if why is None or "last passes" in why:
            return
        tick.wait(0.025)
    raise AssertionError("the read left behind never returned")


def test_a_slow_gpu_is_held_past_its_budget_and_the_other_read_at_the_same_tick(rig):
    fake, _, backend, guard, slow = rig
    s = sample(guard, backend)
    held = s.readings["gpu0/temperature"]
    assert held.status is Status.STALE, "the slow GPU's whole read was waited for"
    assert value(s, "gpu1/temperature") == 41.0 and "gpu1" not in s.lost  # the rest of the pass, same tick
    assert guard.hangs == 1 and "gpu0" in s.lost and backend.worker.hung("gpu0") is not None
    with pytest.raises(BackendTimeout):  # refused at once, not queued on the worker for seconds
        backend.write_knob("gpu0/power_limit", 300.0)
    uuid = backend.devices()[0].info["uuid"]  # the stop's restore is tried: its calls answer, slowly
    backend.restore_knob("gpu0/power_limit", {"limit_mw": 300_000, "uuid": uuid})
    assert fake.gpus[0].limit_mw == 300_000
    slow.open()
    returned(backend)
    s = sample(guard, backend)  # it answers in time again: read
    assert value(s, "gpu0/temperature") is not None and value(s, "gpu1/power") == 69.85


def test_a_gpu_slow_at_each_of_its_last_passes_is_held_for_a_back_off_not_read(rig):
    fake, clock, backend, guard, slow = rig
    for _ in range(HUNG_PASSES):
        slow.arm()
        s = sample(guard, backend)
        assert s.readings["gpu0/temperature"].status is Status.STALE and value(s, "gpu1/temperature") == 41.0
        slow.open()
        returned(backend)
    calls, hangs = slow.calls, guard.hangs
    slow.arm()
    s = sample(guard, backend)  # held for its back-off: not read, no hold-up
    assert slow.calls == calls and guard.hangs == hangs == HUNG_PASSES
    stale = s.readings["gpu0/temperature"]
    assert stale.status is Status.STALE and "slow" in stale.detail
    assert "gpu0" in s.lost and value(s, "gpu1/temperature") == 41.0
    with pytest.raises(BackendTimeout):  # refused at once, not queued on the worker for seconds
        backend.write_knob("gpu0/power_limit", 300.0)
    slow.open()
    del fake._hangs[0]  # noqa: SLF001 - fast again
    clock.advance(BACKOFF_S)
    s = sample(guard, backend)
    assert value(s, "gpu0/temperature") is not None and guard.hangs == HUNG_PASSES
    assert list(backend.skip) == []


def value(sample, channel: str) -> float | None:
    reading = sample.readings[channel]
    return reading.value if reading.status is Status.OK else None
