"""Sensor trust on simulated timelines of the recorded X570 board's readings: transient faults and spikes
held for one reading, persistent and confirmed ones passed through, and the failsafe bound."""

from __future__ import annotations

import errno
import os

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.trust import SensorTrust, TrustOptions
from aithermd.model import Reading, Status

from .helpers import MACHINES_DIR

K10 = "hwmon:k10temp-pci-00c3/temp1"  # Tctl, a CPU die: 80 °C/s
SYSTIN = "hwmon:nct6798-isa-0290/temp1"  # a board thermistor: 15 °C/s


@pytest.fixture(scope="module")
def devices():
    backend = HwmonBackend(str(MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"))
    found = backend.discover()
    backend.close()
    return found


def ok(cid, value):
    return Reading(cid, value)


def err(cid, code):
    return Reading(cid, None, Status.FAILED, f"{errno.errorcode[code]}: {os.strerror(code)}")


def run(devices, timeline, options=None):
    """Feed ``[(t, reading), ...]`` one per tick; return what the engine saw each tick."""
    trust = SensorTrust(options)
    trust.configure(devices)
    return [trust.filter(t, {r.channel_id: r})[r.channel_id] for t, r in timeline]


@pytest.mark.parametrize("code", [errno.EIO, errno.ENODATA, errno.EAGAIN, errno.ETIMEDOUT, errno.ENXIO])
def test_one_transient_error_is_bridged_and_a_second_confirms(devices, code):
    seen = run(devices, [(0.0, ok(K10, 45.0)), (1.0, err(K10, code)), (2.0, ok(K10, 46.0)),
                         (3.0, err(K10, code)), (4.0, err(K10, code))])
    assert [(r.status, r.value) for r in seen] == [
        (Status.OK, 45.0), (Status.OK, 45.0), (Status.OK, 46.0), (Status.OK, 46.0), (Status.FAILED, None)]
    assert seen[1].detail.startswith(f"held: failed: {errno.errorcode[code]}")
    assert "read 1 of 2" in seen[1].detail


@pytest.mark.parametrize("code", [errno.ENODEV, errno.ENOENT, errno.EACCES])
def test_a_persistent_error_fails_at_once(devices, code):
    seen = run(devices, [(0.0, ok(K10, 45.0)), (1.0, err(K10, code))])
    assert (seen[1].status, seen[1].value) == (Status.FAILED, None)


def test_a_sentinel_is_held_once_and_confirmed_nonsense_the_second_time(devices):
    sentinel = Reading(K10, None, Status.IMPLAUSIBLE, "sentinel 127 °C (a saturated register)")
    seen = run(devices, [(0.0, ok(K10, 45.0)), (1.0, sentinel), (2.0, sentinel)])
    assert [(r.status, r.value) for r in seen[1:]] == [(Status.OK, 45.0), (Status.IMPLAUSIBLE, None)]


def test_a_spike_is_held_and_dropped_when_the_next_reading_returns(devices):
    seen = run(devices, [(0.0, ok(SYSTIN, 28.0)), (1.0, ok(SYSTIN, 90.0)), (2.0, ok(SYSTIN, 28.5))])
    assert [r.value for r in seen] == [28.0, 28.0, 28.5]
    assert seen[1].detail.startswith("held: 90 jumped from 28 in 1 s, faster than 15/s")


def test_a_real_rise_is_taken_at_the_second_reading(devices):
    seen = run(devices, [(0.0, ok(SYSTIN, 28.0)), (1.0, ok(SYSTIN, 90.0)), (2.0, ok(SYSTIN, 91.0)),
                         (3.0, ok(SYSTIN, 92.0))])
    assert [r.value for r in seen] == [28.0, 28.0, 91.0, 92.0]
    assert seen[2].detail is None


def test_a_cpu_die_moves_fast_without_being_held(devices):
    """Tctl rises tens of °C within a second at a load step: within its 80 °C/s, taken as it comes."""
    seen = run(devices, [(0.0, ok(K10, 40.0)), (1.0, ok(K10, 75.0)), (2.0, ok(K10, 88.0))])
    assert [r.value for r in seen] == [40.0, 75.0, 88.0]


def test_nothing_is_held_when_the_last_good_value_is_older_than_the_bound(devices):
    """Ticks 5 s apart: a last good value 5 s old is too old to carry; the fault acts at once."""
    seen = run(devices, [(0.0, ok(K10, 45.0)), (5.0, err(K10, errno.EIO))])
    assert seen[1].status == Status.FAILED
    seen = run(devices, [(0.0, ok(SYSTIN, 28.0)), (5.0, ok(SYSTIN, 120.0))])
    assert seen[1].value == 120.0


def test_a_first_read_that_fails_is_not_hidden(devices):
    seen = run(devices, [(0.0, err(K10, errno.EIO))])
    assert seen[0].status == Status.FAILED


def test_confirm_reads_1_trusts_every_reading(devices):
    seen = run(devices, [(0.0, ok(K10, 45.0)), (1.0, err(K10, errno.EIO))], TrustOptions(confirm_reads=1))
    assert seen[1].status == Status.FAILED


def test_the_failsafe_bound_in_ticks_and_seconds(devices):
    """A failure that starts right after a good read reaches the engine with the 2nd bad read: 2 ticks
    at 1 s, 1 s after the first bad read, 2 s after the last good one (≤ 3 s); at 0.25 s ticks the 2nd bad
    read too."""
    for tick_s in (0.25, 0.5, 1.0, 1.5):
        timeline = [(0.0, ok(K10, 45.0))] + [(tick_s * n, err(K10, errno.EIO)) for n in range(1, 6)]
        seen = run(devices, timeline)
        first_failed = next(n for n, r in enumerate(seen) if r.status == Status.FAILED)
        assert first_failed == 2, tick_s
        assert tick_s * first_failed <= 3.0


def test_unchanged_readings_are_passed_through_as_they_are(devices):
    trust = SensorTrust()
    trust.configure(devices)
    readings = {K10: ok(K10, 45.0), SYSTIN: ok(SYSTIN, 28.0)}
    assert trust.filter(0.0, readings) is readings
    assert trust.filter(1.0, readings) is readings
