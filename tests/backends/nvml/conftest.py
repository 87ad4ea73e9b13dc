"""Fixtures: fake NVML GPUs from the recorded dumps, and NVML backends over them (closed after the test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.backends.nvml import NvmlBackend
from aithermd.clock import FakeClock
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.smi_dump import load_dump

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi-q"
RTX4090 = DUMPS / "rtx4090-x8-nvidia-smi-q.txt"  # driver 550, 150–450 W, one fan
H100 = DUMPS / "h100-80gb-hbm3-nvidia-smi-q-idle-and-load.txt"  # driver 590, HBM temperature, no fan
A6000 = DUMPS / "rtx-a6000-x9-nvidia-smi-q-linux.txt"


def profile(path: Path, index: int = 0):
    return load_dump(path)[index]


@pytest.fixture
def backend_over():
    """``backend_over(fake, **kw)`` → a discovered NvmlBackend over the fake's private pynvml copy."""
    made: list[NvmlBackend] = []

    def make(fake: FakeNvml, **kw) -> NvmlBackend:
        backend = NvmlBackend(nvml=fake.bindings(), **kw)
        made.append(backend)
        backend.discover()
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def workstation():
    """Two GPUs: an RTX 4090 with two fans (manual/auto control) and an H100 (passive, HBM)."""
    return FakeNvml([profile(RTX4090), profile(H100)], fan_count=[2, None], driver_version="590.48.01")


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make(clock, backend_over):
    """``make(fake)``: :func:`backend_over` on the fake clock (discovered, closed after)."""
    return lambda fake: backend_over(fake, clock=clock)


def two() -> FakeNvml:
    """An RTX 4090 with one fan and an H100 without, as driver 590 shows them."""
    return FakeNvml([profile(RTX4090), profile(H100)], fan_count=[1, None], driver_version="590.48.01")


def released(backend: NvmlBackend, gpu: str, within_s: float = 5.0) -> bool:
    """Whether the worker let ``gpu`` go (its stuck call returned) within ``within_s`` of real time: a
    hang is made with a real thread, so its end is awaited, polled every 50 ms."""
    import threading

    tick = threading.Event()
    for _ in range(int(within_s / 0.05)):
        if backend.worker.hung(gpu) is None:
            return True
        tick.wait(0.05)
    return backend.worker.hung(gpu) is None
