"""NVML_ERROR_UNKNOWN on ONE GPU's temperature only (attack11 G2): its other calls, writes included, answer.
UNKNOWN is a code only a new nvmlInit should cure, so the GPU went ``down`` and, the re-init curing nothing,
stayed down for good: skipped (in ``Sample.lost``), its fans left at the policy's manual duty with the die
unread, where any other error code made the reading failed (a failed sensor: fans to full). Now, once a
re-init cured nothing and the GPU's other calls answer, it is read again with that reading failed; a read
whose every call fails is NVML down after all."""

from __future__ import annotations

import pynvml as E
import structlog

from aithermd.model import Status
from tests.backends.nvml.conftest import two

TEMPERATURE = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")


def test_unknown_error_on_one_gpus_temperature_is_that_readings_failure_once_a_reinit_cured_nothing(
        make, clock):
    fake = two()
    backend = make(fake)
    for fn in TEMPERATURE:
        fake.inject(fn, 0, E.NVML_ERROR_UNKNOWN)  # gpu0 (the RTX 4090, one fan): its temperature only
    s = backend.sample()
    assert "gpu0" in s.lost  # first: NVML may be broken under us, a re-init is due
    clock.advance(1.0)
    with structlog.testing.capture_logs() as logs:
        s = backend.sample()  # re-initialised: cured nothing, the GPU's other calls answer
    assert [e["gpu"] for e in logs if e["event"] == "gpu_partial"] == ["gpu0"]
    assert "gpu0" not in s.lost and s.health["nvml"]["gpus"]["gpu0"]["state"] == "ok"
    temp = s.readings["gpu0/temperature"]
    assert temp.status is Status.FAILED and "UNKNOWN" in temp.detail  # the sensor trust confirms it
    assert s.readings["gpu0/power"].status is Status.OK and "gpu0/fan0" in s.knobs
    backend.write_knob("gpu0/fan0", 100.0)  # what the safety layer writes for a confirmed failed sensor
    assert fake.gpus[0].fans[0].manual and fake.gpus[0].fans[0].target_pct == 100
    for _ in range(3):
        clock.advance(1.0)
        s = backend.sample()
        assert "gpu0" not in s.lost and s.readings["gpu0/temperature"].status is Status.FAILED
    fake.inject("*", 0, E.NVML_ERROR_UNKNOWN)  # now every call on it: NVML down after all
    clock.advance(1.0)
    assert "gpu0" in backend.sample().lost
    fake.clear_injections()  # cured: read as usual
    for _ in range(3):
        clock.advance(5.0)
        s = backend.sample()
    assert s.readings["gpu0/temperature"].status is Status.OK and "gpu0" not in s.lost


def test_a_gpu_whose_other_calls_fail_too_stays_down(make, clock):
    fake = two()
    backend = make(fake)
    for fn in (*TEMPERATURE, "nvmlDeviceGetUtilizationRates"):
        fake.inject(fn, 0, E.NVML_ERROR_UNKNOWN)  # a capability it had would be lost: not taken as partial
    backend.sample()
    for _ in range(3):
        clock.advance(1.0)
        s = backend.sample()
        assert "gpu0" in s.lost and s.readings["gpu1/power"].status is Status.OK
