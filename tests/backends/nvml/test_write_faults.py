"""A write that fails is a fault of its knob, not the loss of its GPU (attack report F1): through the real
pynvml bindings over the fake NVML, one set call answering NVML_ERROR_UNKNOWN for good while every read
answers. The GPU is still read (its temperature keeps feeding the fans), the knob's writes back off, probe
writes decide nothing about the GPU, and the restore at the stop tries every knob on its own."""

from __future__ import annotations

import pynvml as E
import pytest
import structlog

from aithermd.errors import BackendError, DeviceLost, OutOfRange
from aithermd.model import Status
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import two


def inits(fake: FakeNvml) -> int:
    return fake.calls.get("nvmlInitWithFlags", 0) + fake.calls.get("nvmlInit_v2", 0)


def test_a_set_call_failing_for_good_is_a_knob_fault_and_the_gpu_is_still_read(make, clock):
    fake = two()
    backend = make(fake)
    n = inits(fake)
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN)
    with structlog.testing.capture_logs() as logs, pytest.raises(BackendError) as err:
        backend.write_knob("gpu0/power_limit", 282.0)
    assert type(err.value) is BackendError and "NVML_ERROR_UNKNOWN" in str(err.value)
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["knob_write_failed"]
    for _ in range(180):  # three minutes: gpu0 stays read, its temperature a reading like any other
        clock.advance(1.0)
        s = backend.sample()
        assert s.lost == frozenset() and s.readings["gpu0/temperature"].status is Status.OK
    assert s.readings["gpu0/temperature"].value == 28.0 and s.knobs["gpu0/power_limit"].value == 450.0
    assert s.health["nvml"]["gpus"]["gpu0"]["state"] == "ok" and inits(fake) == n, "no nvmlInit again"
    backend.write_knob("gpu0/fan0", 60.0)  # the GPU's other knobs are written as usual
    assert fake.fan_target_pct(0, 0) == 60 and not fake.fan_auto(0, 0)


def test_a_failing_knob_is_tried_again_with_backoff_and_comes_back(make, clock):
    fake = two()
    backend = make(fake)
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN)
    asked = []
    for _ in range(20):  # one write a second, as a safety decision that does not hold would be
        before = fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)
        with pytest.raises(BackendError, match="NVML_ERROR_UNKNOWN"):
            backend.write_knob("gpu0/power_limit", 300.0)
        asked.append(fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0) - before)
        clock.advance(1.0)
    assert [i for i, a in enumerate(asked) if a] == [0, 2, 6, 14], "2, 4, 8 s apart, not every tick"
    fake.clear_injections()
    clock.advance(16.0)
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 300.0)
    assert fake.power_limit_w(0) == 300.0 and [e["event"] for e in logs] == ["knob_write_back"]
    backend.write_knob("gpu0/power_limit", 310.0)  # no backoff left
    assert fake.power_limit_w(0) == 310.0


def test_a_new_value_is_tried_at_once_whatever_the_backoff_of_the_last(make, clock):
    """A safety cut to the minimum after the policy's 300 W failed: the backoff of the failed request must
    not hold the cut off for up to a minute; the same request still waits."""
    fake = two()
    backend = make(fake)
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN, count=1)
    with pytest.raises(BackendError, match="NVML_ERROR_UNKNOWN"):
        backend.write_knob("gpu0/power_limit", 300.0)
    before = fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)
    with pytest.raises(BackendError):
        backend.write_knob("gpu0/power_limit", 300.0)  # the same request, within its backoff: not asked
    assert fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0) == before
    backend.write_knob("gpu0/power_limit", 150.0)  # the cut: asked at once, and the driver takes it
    assert fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0) == before + 1 and fake.power_limit_w(0) == 150.0


def test_probe_writes_that_fail_never_keep_a_gpu_down(make, clock):
    """The F1 trap: a read's Unknown Error re-handles the GPU, whose probe wrote the limit and the fan
    again, failed again, and kept the GPU down for good."""
    fake = two()
    backend = make(fake)
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN)
    fake.inject("nvmlDeviceSetFanSpeed_v2", 0, E.NVML_ERROR_UNKNOWN)
    fake.inject("nvmlDeviceSetDefaultFanSpeed_v2", 0, E.NVML_ERROR_UNKNOWN)
    fake.inject("nvmlDeviceGetFieldValues", 0, E.NVML_ERROR_UNKNOWN, count=1)  # one read: NVML breaks
    assert backend.sample().lost == {"gpu0"}
    clock.advance(1.0)
    s = backend.sample()  # initialised again, looked up and probed again: back, the knobs still writable
    assert s.lost == frozenset() and s.readings["gpu0/temperature"].status is Status.OK
    (gpu0, _) = backend.discover()
    assert [k.id for k in gpu0.knobs if k.writable][:2] == ["gpu0/power_limit", "gpu0/fan0"]
    fresh = make(fake)  # found with the set calls already broken: the GPU and its knobs are there
    assert [k.id for k in fresh.discover()[0].knobs if k.writable][:2] == ["gpu0/power_limit", "gpu0/fan0"]


def test_the_restore_tries_each_knob_whatever_one_set_call_does(make, clock):
    fake = two()
    backend = make(fake)
    limit, fan = backend.save_knob("gpu0/power_limit"), backend.save_knob("gpu0/fan0")
    assert fan["mode"] == "auto"
    backend.write_knob("gpu0/power_limit", 300.0)
    backend.write_knob("gpu0/fan0", 50.0)
    fake.inject("nvmlDeviceSetFanSpeed_v2", 0, E.NVML_ERROR_UNKNOWN)
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError):
        backend.write_knob("gpu0/fan0", 70.0)
    clock.advance(1.0)
    assert backend.restore_knob("gpu0/fan0", fan) is None  # back to auto: another call, it works
    assert fake.fan_auto(0, 0)
    with pytest.raises(BackendError, match="NVML_ERROR_UNKNOWN") as err:
        backend.restore_knob("gpu0/power_limit", limit)  # really broken: said so, and it is tried
    assert not isinstance(err.value, DeviceLost) and fake.power_limit_w(0) == 300.0
    fake.clear_injections("nvmlDeviceSetPowerManagementLimit", 0)
    backend.restore_knob("gpu0/power_limit", limit)
    assert fake.power_limit_w(0) == limit["limit_mw"] / 1000 == 450.0


def test_a_manual_fan_whose_duty_cannot_be_put_back_is_handed_to_the_driver(make):
    fake = two()
    backend = make(fake)
    backend.write_knob("gpu0/fan0", 60.0)  # found manual at 60 % (another tool left it so)
    fan = backend.save_knob("gpu0/fan0")
    backend.write_knob("gpu0/fan0", 80.0)
    fake.inject("nvmlDeviceSetFanSpeed_v2", 0, E.NVML_ERROR_UNKNOWN)
    note = backend.restore_knob("gpu0/fan0", fan)
    assert fake.fan_auto(0, 0) and "automatic curve instead of 60 % manual" in note


@pytest.mark.parametrize("found, to_writer, auto", [(40.0, False, True), (40.0, True, False),
                                                    (60.0, False, False)])
def test_a_fan_found_manual_at_a_low_speed_goes_to_the_drivers_curve_unless_its_writer_takes_it(
        make, found, to_writer, auto):
    """A GPU fan found in manual mode under 50 % (what is found when the true original was lost: a journal
    moved aside, another tool's crash) is not put back there: nothing would drive it once the daemon is gone
    (attack6 G1/G5/G9). Handed back to the program that keeps writing it, it is put back as found."""
    fake = two()
    backend = make(fake)
    backend.write_knob("gpu0/fan0", found)
    fan = backend.save_knob("gpu0/fan0")
    backend.write_knob("gpu0/fan0", 80.0)
    note = backend.restore_knob("gpu0/fan0", {**fan, "to_writer": True} if to_writer else fan)
    assert fake.fan_auto(0, 0) is auto
    assert (note is not None and "found in manual mode at 40 %" in note) is auto
    if not auto:
        assert backend.read_knob("gpu0/fan0").value == pytest.approx(found, abs=1.0)


def test_a_restore_whose_write_fails_but_finds_the_original_in_place_is_done(make):
    fake = two()
    backend = make(fake)
    limit = backend.save_knob("gpu0/power_limit")  # never changed: the write failed from the start
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError):
        backend.write_knob("gpu0/power_limit", 282.0)
    assert backend.restore_knob("gpu0/power_limit", limit) is None and fake.power_limit_w(0) == 450.0


def test_a_lost_gpu_still_refuses_writes_and_its_restore_says_so(make, clock):
    fake = two()
    backend = make(fake)
    limit = backend.save_knob("gpu1/power_limit")
    fake.inject("nvmlDeviceGetFieldValues", 1, E.NVML_ERROR_GPU_IS_LOST)
    assert backend.sample().lost == {"gpu1"}
    with pytest.raises(DeviceLost):
        backend.write_knob("gpu1/power_limit", 500.0)
    fake.lose_gpu(1)
    with pytest.raises(DeviceLost, match="GPU_IS_LOST"):
        backend.restore_knob("gpu1/power_limit", limit)


def test_a_cut_the_driver_refuses_goes_as_deep_as_it_takes_and_the_refused_call_is_not_made_again(make):
    """The driver refuses limits under 250 W although its constraints say 150 W: a safety cut to 150 W was
    refused every tick and the GPU kept its whole limit. Now the cut lands on the lowest limit the driver
    takes (found within 1 W), said once, and later requests start from that floor."""
    fake = two()
    backend = make(fake)
    fake.refuse_power_below(0, 250.0)
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 150.0)
    assert 250.0 <= fake.power_limit_w(0) <= 251.0
    (said,) = [e for e in logs if e["event"] == "power_limit_floor"]
    assert said["asked_w"] == 150.0 and said["floor_w"] == fake.power_limit_w(0)
    calls = fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)
    backend.write_knob("gpu0/power_limit", 150.0)  # the same cut next tick: one call, taken
    assert fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0) == calls + 1
    backend.write_knob("gpu0/power_limit", 400.0)  # above the floor: as asked
    assert fake.power_limit_w(0) == 400.0
    with pytest.raises(OutOfRange):  # outside the reported constraints: refused as before, no search
        backend.write_knob("gpu0/power_limit", 50.0)



def test_a_fan_found_manual_at_a_low_speed_whose_curve_is_refused_is_left_at_full_speed_not_there(make):
    """attack7 H6: the driver's curve refused once, the fan was found "in place" (manual 20 %, as saved) and
    the restore said it was done: left manual at 20 % with no note."""
    fake = two()
    backend = make(fake)
    backend.write_knob("gpu0/fan0", 20.0)  # found manual at 20 % (a crash left it so)
    saved = backend.save_knob("gpu0/fan0")
    fake.inject("nvmlDeviceSetDefaultFanSpeed_v2", 0, E.NVML_ERROR_UNKNOWN)
    note = backend.restore_knob("gpu0/fan0", saved)
    assert note is not None and "left at 100 % instead of 20" in note
    assert backend.read_knob("gpu0/fan0").value == pytest.approx(100.0, abs=1.0)
