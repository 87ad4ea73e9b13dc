"""The tick's NVML reads on the read guard's thread itself (backends/nvml_pass.Inline): no hand-off to the
NVML worker while every GPU answers; a GPU whose read hangs is held hung (its knobs refused), the other GPU
is read at the same tick, and once the read returns that GPU is read again on the guard's thread."""

from __future__ import annotations

import asyncio

import pytest

from aithermd.backends.guard import ReadGuard
from aithermd.backends.nvml import NvmlBackend
from aithermd.clock import FakeClock
from aithermd.errors import BackendTimeout
from aithermd.model import Status
from tests.backends.nvml.conftest import released, two


@pytest.fixture
def backend_of(backend_over):
    """The conftest's backend_over on a fake clock."""
    return lambda fake, **kw: backend_over(fake, clock=FakeClock(), **kw)


def handed(backend: NvmlBackend) -> list[list[str]]:
    """Records the GPUs of every pass handed to the worker (``NvmlWorker.each``)."""
    passes: list[list[str]] = []
    each = backend.worker.each

    def spy(items, fn, timeout_s=None):
        items = list(items)
        passes.append([g for g, _ in items])
        return each(items, fn, timeout_s)

    backend.worker.each = spy  # type: ignore[method-assign]
    return passes


def guarded_sample(guard: ReadGuard, backend: NvmlBackend):
    channels = [c.id for d in backend.devices() for c in d.channels]
    (sample,) = asyncio.run(guard.sample([backend], lambda b: b.sample(), lambda b: channels,
                                         lambda: 0.0, lambda b: 30.0))
    return sample


def value(sample, channel: str) -> float | None:
    reading = sample.readings[channel]
    return reading.value if reading.status is Status.OK else None


def test_gpus_that_answer_are_read_on_the_guards_thread_with_no_hand_off(backend_of):
    fake = two()
    backend = backend_of(fake)
    passes = handed(backend)
    guard = ReadGuard(deadline_s=5.0)
    try:
        s = guarded_sample(guard, backend)
        assert value(s, "gpu0/temperature") is not None and value(s, "gpu1/temperature") == 41.0
        assert passes == []  # read where the guard waits: no job for the worker's thread
        assert value(backend.sample(), "gpu1/temperature") == 41.0  # off the guard's thread: on the worker
        assert passes == [["gpu0", "gpu1"]]
    finally:
        guard.close()


def test_a_gpu_hung_on_the_guards_thread_is_held_the_other_read_at_the_same_tick(backend_of):
    fake = two()
    backend = backend_of(fake, read_deadline_s=0.2)
    passes = handed(backend)
    guard = ReadGuard(deadline_s=5.0)  # the pass's deadline does not apply: the GPU's own does
    fake.hang(0)
    try:
        s = guarded_sample(guard, backend)
        stuck = s.readings["gpu0/temperature"]
        assert stuck.status is Status.STALE and "hung" in stuck.detail
        assert value(s, "gpu1/temperature") == 41.0 and "gpu1" not in s.lost  # read on a new thread
        assert guard.hangs == 1 and backend.worker.hung("gpu0") is not None
        assert s.health["nvml"]["gpus"]["gpu0"]["state"] == "hung"
        with pytest.raises(BackendTimeout, match="hung"):
            backend.write_knob("gpu0/power_limit", 300.0)  # refused at once, as a hang on the worker
        uuid = backend.devices()[0].info["uuid"]
        with pytest.raises(BackendTimeout, match="hung"):  # and the stop's restore: no 2 s wait per knob
            backend.restore_knob("gpu0/power_limit", {"limit_mw": 300_000, "uuid": uuid})
        s = guarded_sample(guard, backend)  # not asked again while its read is stuck
        assert s.readings["gpu0/temperature"].status is Status.STALE
        assert value(s, "gpu1/power") == 69.85 and guard.hangs == 1
    finally:
        fake.unhang()
    assert released(backend, "gpu0", 5), "the stuck read returned and released its GPU"
    try:
        s = guarded_sample(guard, backend)
        assert value(s, "gpu0/temperature") is not None and value(s, "gpu1/temperature") == 41.0
        assert passes == []  # the GPU that hung is read again where the guard waits (test_nvml_slow.py)
    finally:
        guard.close()
