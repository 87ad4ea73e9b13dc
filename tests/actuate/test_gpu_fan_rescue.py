"""The rescue's full duty (:func:`aithermd.actuate.rescue.full_duty`) for a GPU-hwmon fan (amdgpu) as for a
board fan: write only, nothing read (a read of a chip that stops answering may block for ever):
``pwm1_enable`` 1 and ``pwm1`` 255, else ``pwm1_enable`` 0, which amdgpu's fan code takes as full speed
(AMD_FAN_CTRL_NONE: smu7, vega10/20, SMU11 100 %, SMU13 pwm 255). Before the GPU backend had ``pwm_knob``
it went through ``write_knob``, which reads the mode first."""

from __future__ import annotations

import errno

import pytest

from aithermd.actuate.rescue import full_duty
from aithermd.backends.gpu_hwmon import HwmonGpuBackend
from tests.backends.faults import FaultIO
from tests.backends.test_gpu_hwmon import tree


@pytest.fixture
def card(tmp_path):
    io = FaultIO()
    backend = HwmonGpuBackend(str(tree(tmp_path, "rx7900xtx")), io=io)
    (device,) = backend.discover()
    fan = next(k for k in device.knobs if k.id == "gpu0/fan0")
    io.reads.clear()
    yield backend, io, fan
    backend.close()


def written(io: FaultIO) -> list[tuple[str, bytes]]:
    return [(path.rsplit("/", 1)[1], data.strip()) for path, data in io.writes]


def test_a_gpu_fan_gets_manual_full_duty_without_a_read(card):
    backend, io, fan = card
    note = full_duty(backend, fan)
    assert note == "gpu0/fan0: its chip does not answer: left at full duty (pwm 255) instead"
    assert written(io) == [("pwm1_enable", b"1"), ("pwm1", b"255")]
    assert sum(io.reads.values()) == 0


def test_a_gpu_fan_whose_duty_is_refused_gets_amdgpus_full_speed_mode(card):
    backend, io, fan = card
    io.write_faults["/pwm1"] = OSError(errno.EINVAL, "Invalid argument")
    note = full_duty(backend, fan)
    assert note == "gpu0/fan0: its chip does not answer: left at full speed (enable 0) instead"
    assert written(io) == [("pwm1_enable", b"1"), ("pwm1_enable", b"0")]
    assert sum(io.reads.values()) == 0
