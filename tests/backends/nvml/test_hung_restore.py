"""One hung GPU never fails the restore of another (attack report F5): through the real pynvml bindings over
the fake NVML, a call on gpu0 that never returns while gpu1's restore waits behind it on the NVML worker.
The restore was cancelled with the stuck thread's queue (CancelledError, an empty message) or, with nobody
waiting on the stuck call, timed out and marked the healthy gpu1 hung."""

from __future__ import annotations

import threading
import time

import pytest

from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.nvml_worker import NvmlWorker
from aithermd.errors import BackendTimeout
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import H100, RTX4090, profile


def _until(predicate, tries=500):
    """Wait (bounded, 10 ms steps) for ``predicate``; no timing is asserted."""
    for _ in range(tries):
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def rig():
    """Two GPUs, gpu1's power limit lowered to 500 W (its original saved), and a worker with short
    deadlines; every hung call is let go at the end."""
    fake = FakeNvml([profile(RTX4090), profile(H100)], fan_count=[1, None], driver_version="590.48.01")
    worker = NvmlWorker(name="nvml-hung", timeout_s=0.3)
    backend = NvmlBackend(nvml=fake.bindings(), worker=worker)
    backend.discover()
    saved = {k: backend.save_knob(k) for k in ("gpu0/power_limit", "gpu1/power_limit")}
    backend.write_knob("gpu1/power_limit", 500.0)
    yield fake, backend, saved
    fake.unhang()
    backend.close()
    worker.close()


def _busy(worker: NvmlWorker) -> bool:
    executor = worker._executor  # noqa: SLF001 - waiting for the stuck call to begin, nothing asserted
    return executor is not None and getattr(executor, "running", True) is not None


def test_a_restore_queued_behind_a_hung_write_of_another_gpu_is_made(rig):
    fake, backend, saved = rig
    fake.hang(0)
    errors: list[BaseException] = []

    def write_gpu0() -> None:
        try:
            backend.write_knob("gpu0/power_limit", 300.0)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    writer = threading.Thread(target=write_gpu0)
    writer.start()
    assert _until(lambda: _busy(backend.worker))
    results: dict[str, object] = {}

    def restore(knob: str) -> None:
        try:
            results[knob] = backend.restore_knob(knob, saved[knob])
        except BaseException as exc:  # noqa: BLE001
            results[knob] = exc

    queued = [threading.Thread(target=restore, args=(k,)) for k in ("gpu1/power_limit", "gpu0/power_limit")]
    for t in queued:
        t.start()
    writer.join(10.0)
    for t in queued:
        t.join(10.0)
    assert [type(e) for e in errors] == [BackendTimeout] and backend.worker.hung("gpu0") is not None
    assert results["gpu1/power_limit"] is None and fake.power_limit_w(1) == 700.0, "gpu1 put back"
    gpu0 = results["gpu0/power_limit"]
    assert isinstance(gpu0, BackendTimeout) and "gpu0" in str(gpu0) and "hung" in str(gpu0)
    assert backend.worker.hung("gpu1") is None


def test_a_restore_behind_a_hung_read_nobody_waits_for_is_made_and_no_healthy_gpu_is_called_hung(rig):
    """The fast lane's poll of gpu0 hangs and the lane stops (no later poll marks gpu0 hung): the stop's
    restore of gpu1 waits behind it."""
    fake, backend, saved = rig
    fake.hang(0)
    slot = backend.life.slots["gpu0"]
    assert backend.worker.poll([("gpu0", slot)], lambda s: s.reader.call("nvmlDeviceGetTemperature", 0),
                               wait_s=0.01) is None
    assert _until(lambda: _busy(backend.worker))
    assert backend.restore_knob("gpu1/power_limit", saved["gpu1/power_limit"]) is None
    assert fake.power_limit_w(1) == 700.0 and backend.worker.hung("gpu1") is None
    assert backend.sample().lost <= {"gpu0"}
