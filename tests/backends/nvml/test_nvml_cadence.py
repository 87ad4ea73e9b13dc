"""What one tick of the NVML backend asks, through the real pynvml bindings over the fake NVML: the
persistence mode every 30 s instead of every tick, no hop to the worker for maintenance when none is due,
and readings that follow the GPU whatever was read before."""

from __future__ import annotations

import pytest

from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.nvml_gpu import PERSISTENCE_EVERY_S
from aithermd.clock import FakeClock
from aithermd.model import Status
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import H100, RTX4090, profile


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def two(clock):
    fake = FakeNvml([profile(RTX4090), profile(H100)], fan_count=[1, None], driver_version="590.48.01")
    backend = NvmlBackend(nvml=fake.bindings(), clock=clock)
    backend.discover()
    yield fake, backend
    backend.close()


def test_the_persistence_mode_is_asked_every_30_s_and_follows_a_change(two, clock):
    fake, backend = two
    assert backend.sample().attrs["gpu0"]["persistence_mode"] is True
    asked = fake.calls.get("nvmlDeviceGetPersistenceMode", 0)
    fake.set_dynamic(0, persistence_mode=False, pstate="P8")  # nvidia-smi -pm 0
    clock.advance(PERSISTENCE_EVERY_S - 1.0)
    s = backend.sample()
    assert s.attrs["gpu0"]["pstate"] == "P8"  # the P-state: every tick
    assert s.attrs["gpu0"]["persistence_mode"] is True
    assert fake.calls.get("nvmlDeviceGetPersistenceMode", 0) == asked
    clock.advance(1.0)
    assert backend.sample().attrs["gpu0"]["persistence_mode"] is False
    assert fake.calls.get("nvmlDeviceGetPersistenceMode", 0) == asked + 2  # both GPUs, once each


def test_a_tick_with_nothing_due_makes_no_maintenance_hop(two, clock):
    fake, backend = two
    runs: list[str] = []
    real = backend.worker.run

    def run(fn, *args, **kw):
        runs.append(getattr(fn, "__name__", repr(fn)))
        return real(fn, *args, **kw)

    backend.worker.run = run
    for _ in range(3):
        clock.advance(1.0)
        assert backend.sample().lost == frozenset()
    assert runs == []
    clock.advance(60.0)  # the periodic look for GPUs that appeared (nvmlDeviceGetCount) is due
    backend.sample()
    assert runs == ["maintain"]
    fake.lose_gpu(1)
    clock.advance(1.0)
    assert backend.sample().lost == {"gpu1"}
    fake.revive_gpu(1)
    for _ in range(10):  # a lost GPU's check comes back with its backoff: maintenance is due then
        clock.advance(5.0)
        if not backend.sample().lost:
            break
    assert backend.sample().lost == frozenset() and runs.count("maintain") >= 2


def test_readings_follow_the_gpu_from_one_tick_to_the_next(two, clock):
    fake, backend = two
    fake.set_dynamic(0, temp_c=50.0, power_draw_w=200.0)
    first = backend.sample().readings
    clock.advance(1.0)
    fake.set_dynamic(0, temp_c=51.0)  # the power unchanged
    second = backend.sample().readings
    assert (first["gpu0/temperature"].value, second["gpu0/temperature"].value) == (50.0, 51.0)
    assert first["gpu0/power"] == second["gpu0/power"] and second["gpu0/power"].value == 200.0
    fake.set_dynamic(0, temp_c=-300.0)  # nonsense: implausible, not the previous value
    clock.advance(1.0)
    third = backend.sample().readings["gpu0/temperature"]
    assert third.status is Status.IMPLAUSIBLE and third.value is None
    fake.set_dynamic(0, temp_c=51.0)
    clock.advance(1.0)
    assert backend.sample().readings["gpu0/temperature"].value == 51.0
