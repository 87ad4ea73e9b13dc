"""Every fault class gives its channel a status while every other channel reads on (the I/O seam)."""

from __future__ import annotations

import errno
import os

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Status

from .faults import FaultIO
from .helpers import MACHINES_DIR

MACHINE = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT = "hwmon:nct6798-isa-0290"
VICTIM = f"{NCT}/temp2"  # CPUTIN, 33.0 °C
VICTIM_FILE = "hwmon1/temp2_input"


def backend_with(faults: dict[str, list]) -> tuple[HwmonBackend, FaultIO]:
    io = FaultIO()
    io.faults.update(faults)
    backend = HwmonBackend(str(MACHINE), io=io)
    backend.discover()
    return backend, io


def assert_others_read_on(sample, victim: str = VICTIM) -> None:
    others = {cid: r for cid, r in sample.readings.items() if cid != victim}
    assert len(others) == 37
    assert all(r.status == Status.OK and r.value is not None for r in others.values())
    assert others[f"{NCT}/temp1"].value == 28.0
    assert others["hwmon:k10temp-pci-00c3/temp1"].value == 32.6


@pytest.mark.parametrize("code", [errno.EIO, errno.ENODATA, errno.ENXIO, errno.EAGAIN, errno.EACCES])
def test_read_error_fails_that_channel_only(code):
    backend, _ = backend_with({VICTIM_FILE: [OSError(code, os.strerror(code))]})
    sample = backend.sample()
    reading = sample.readings[VICTIM]
    assert reading.status == Status.FAILED
    assert reading.value is None
    assert reading.detail.startswith(errno.errorcode[code] + ":")
    assert_others_read_on(sample)
    assert sample.lost == frozenset()
    backend.close()


def test_eopnotsupp_is_a_missing_capability_not_a_failure():
    """Drivers answer EOPNOTSUPP for an attribute the hardware lacks (amdgpu power on some ASICs)."""
    backend, _ = backend_with({VICTIM_FILE: [OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))]})
    sample = backend.sample()
    reading = sample.readings[VICTIM]
    assert (reading.status, reading.value) == (Status.NOT_SUPPORTED, None)
    assert reading.detail.split(":")[0] in ("EOPNOTSUPP", "ENOTSUP")  # the same number on Linux
    assert_others_read_on(sample)
    backend.close()


@pytest.mark.parametrize("code", [errno.ENODEV, errno.ESTALE])
def test_enodev_and_estale_reopen_the_file_and_read_on(code):
    backend, io = backend_with({VICTIM_FILE: [None, OSError(code, os.strerror(code)), None]})
    assert backend.sample().readings[VICTIM].value == 33.0
    path = next(p for p in io.opens if p.endswith(VICTIM_FILE))
    assert io.opens[path] == 1
    second = backend.sample()
    assert second.readings[VICTIM].status == Status.OK
    assert second.readings[VICTIM].value == 33.0
    assert io.opens[path] == 2  # closed and opened again after the fault
    assert_others_read_on(second)
    backend.close()


def test_enodev_that_persists_fails_the_channel():
    backend, _ = backend_with({VICTIM_FILE: [OSError(errno.ENODEV, "No such device")]})
    sample = backend.sample()
    assert sample.readings[VICTIM].status == Status.FAILED
    assert sample.readings[VICTIM].detail.startswith("ENODEV")
    assert_others_read_on(sample)
    assert sample.lost == frozenset()  # one file gone is not the device gone
    backend.close()


def test_device_whose_every_file_is_gone_is_lost():
    backend, _ = backend_with(
        {
            "hwmon2/temp1_input": [OSError(errno.ENODEV, "x")],
            "hwmon2/temp2_input": [OSError(errno.ENODEV, "x")],
            "hwmon2/temp3_input": [OSError(errno.ENODEV, "x")],
        }
    )
    sample = backend.sample()
    assert sample.lost == frozenset({"hwmon:k10temp-pci-00c3"})
    assert sample.readings[f"{NCT}/temp1"].value == 28.0
    backend.close()


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b"", "empty read"),
        (b"330", "torn read"),  # cut short: no newline
        (b"3x000\n", "not a number"),
    ],
)
def test_empty_torn_and_garbled_reads_are_implausible(raw, detail):
    backend, _ = backend_with({VICTIM_FILE: [raw]})
    sample = backend.sample()
    assert sample.readings[VICTIM].status == Status.IMPLAUSIBLE
    assert sample.readings[VICTIM].value is None
    assert sample.readings[VICTIM].detail.startswith(detail)
    assert_others_read_on(sample)
    backend.close()


@pytest.mark.parametrize(
    ("file", "raw", "channel", "why"),
    [
        (VICTIM_FILE, b"-128000\n", VICTIM, "sentinel -128 °C"),  # 8-bit "no diode"
        (VICTIM_FILE, b"-127000\n", VICTIM, "sentinel -127 °C"),
        (VICTIM_FILE, b"127000\n", VICTIM, "sentinel 127 °C"),  # a signed byte's ceiling
        (VICTIM_FILE, b"128000\n", VICTIM, "sentinel 128 °C"),
        (VICTIM_FILE, b"127996\n", VICTIM, "sentinel 127.996 °C"),  # 0x7FFF in 1/256 °C
        (VICTIM_FILE, b"255000\n", VICTIM, "255 °C outside -100…200 °C"),  # all ones
        (VICTIM_FILE, b"-273150\n", VICTIM, "-273.15 °C outside"),  # absolute zero
        (VICTIM_FILE, b"3000000000\n", VICTIM, "outside -100…200 °C"),  # millions of °C
        ("hwmon1/fan1_input", b"65535\n", f"{NCT}/fan1", "65535 RPM outside 0…50000 RPM"),  # all ones
        ("hwmon1/in0_input", b"1500000000\n", f"{NCT}/in0", "outside"),
    ],
)
def test_nonsense_values_are_implausible(file, raw, channel, why):
    backend, _ = backend_with({file: [raw]})
    sample = backend.sample()
    assert sample.readings[channel].status == Status.IMPLAUSIBLE
    assert sample.readings[channel].value is None
    assert why in sample.readings[channel].detail
    assert_others_read_on(sample, victim=channel)
    backend.close()


def test_plausible_edge_values_read_ok():
    backend, _ = backend_with({VICTIM_FILE: [b"-40000\n"], "hwmon1/fan1_input": [b"0\n"]})
    sample = backend.sample()
    assert sample.readings[VICTIM].value == -40.0
    assert sample.readings[f"{NCT}/fan1"].value == 0.0
    backend.close()


def test_open_failure_is_retried_next_sample():
    io = FaultIO()
    io.open_faults[VICTIM_FILE] = [OSError(errno.EACCES, "Permission denied"), None]
    backend = HwmonBackend(str(MACHINE), io=io)
    backend.discover()
    assert backend.sample().readings[VICTIM].status == Status.FAILED
    assert backend.sample().readings[VICTIM].value == 33.0
    backend.close()


def test_each_file_is_opened_once_and_read_once_per_sample():
    backend, io = backend_with({})
    for _ in range(3):
        backend.sample()
    inputs = [p for p in io.reads if p.endswith(("_input", "_average"))]
    assert len(inputs) == 38
    assert all(io.reads[p] == 3 and io.opens[p] == 1 for p in inputs)
    pwm = [p for p in io.reads if os.path.basename(p).startswith("pwm")]
    assert len(pwm) == 14  # 7 pwm files + 7 pwm_enable
    assert all(io.reads[p] == 3 and io.opens[p] == 1 for p in pwm)
    backend.close()
    assert io._paths == {}  # close() released every descriptor


def test_pwm_read_fault_gives_the_knob_a_status():
    backend, _ = backend_with(
        {"hwmon1/pwm2": [OSError(errno.EIO, "Input/output error")], "hwmon1/pwm3": [b"300\n"]}
    )
    knobs = backend.sample().knobs
    assert knobs[f"{NCT}/pwm2"].status == Status.FAILED and knobs[f"{NCT}/pwm2"].value is None
    assert knobs[f"{NCT}/pwm3"].status == Status.IMPLAUSIBLE
    assert knobs[f"{NCT}/pwm1"].status == Status.OK and knobs[f"{NCT}/pwm1"].mode == "auto"
    backend.close()


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.EBUSY])
def test_a_busy_read_is_retried_at_once(code):
    """i2c/pmbus drivers answer EAGAIN/EBUSY while the bus is taken: the second read, at once, gets it."""
    backend, io = backend_with({VICTIM_FILE: [None, OSError(code, os.strerror(code)), None]})
    backend.sample()
    reading = backend.sample().readings[VICTIM]
    assert (reading.status, reading.value) == (Status.OK, 33.0)
    assert io.reads[next(p for p in io.reads if p.endswith(VICTIM_FILE))] == 3
    backend.close()


@pytest.mark.parametrize(("code", "transient"), [
    (errno.EIO, True), (errno.ENODATA, True), (errno.EAGAIN, True), (errno.ETIMEDOUT, True),
    (errno.ENXIO, True),  # an SMBus NAK (i2c-i801: DEV_ERR → -ENXIO), passed through by i2c hwmon drivers
    (errno.ENODEV, False), (errno.ENOENT, False), (errno.EACCES, False)])
def test_fault_class_follows_the_errno(code, transient):
    from aithermd.backends.sysfs import transient as is_transient
    backend, _ = backend_with({VICTIM_FILE: [OSError(code, os.strerror(code))]})
    assert is_transient(backend.sample().readings[VICTIM].detail) is transient
    backend.close()
