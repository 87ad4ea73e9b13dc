"""Power-limit floors learned from refusals (attack4 B10), through the real pynvml bindings over the fake
NVML (mW, the 4090's 150–450 W constraints, NVML_ERROR_INVALID_ARGUMENT): a refusal of a moment across a
safety cut learns nothing (before: a floor at the limit in force, for good), a real floor (the F16 driver,
refusing under 250 W inside its constraints) still lands the cut as deep as it goes but is asked under again
with backoff, a floor never raises the limit in force, and a GPU reset forgets it."""

from __future__ import annotations

import pynvml as E
import pytest
import structlog

from aithermd.errors import BackendError
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import two

SET = "nvmlDeviceSetPowerManagementLimit"
KNOB = "gpu0/power_limit"


def sets(fake: FakeNvml) -> int:
    return fake.calls.get(SET, 0)


def cut_every_second(backend, fake, clock, value: float, seconds: int) -> list[int]:
    """Write ``value`` once a simulated second (a safety cut that does not hold); the seconds at which a
    write made more than one set call (a search under the floor)."""
    searched = []
    for t in range(seconds):
        clock.advance(1.0)
        n = sets(fake)
        backend.write_knob(KNOB, value)
        if sets(fake) - n > 1:
            searched.append(t)
    return searched


def test_a_refusal_of_a_moment_across_a_safety_cut_learns_no_floor_and_the_cut_lands_when_it_ends(
        make, clock):
    fake = two()
    backend = make(fake)
    backend.write_knob(KNOB, 300.0)  # the driver takes limits well under 450 W
    backend.write_knob(KNOB, 450.0)  # the policy's maximum
    fake.inject(SET, 0, E.NVML_ERROR_INVALID_ARGUMENT)  # a Dynamic Boost range moving, for a moment
    with structlog.testing.capture_logs() as logs, pytest.raises(BackendError) as err:
        backend.write_knob(KNOB, 160.0)  # the critical-temperature cut
    assert type(err.value).__name__ == "Uncontrollable" and "cannot cut" in str(err.value), \
        "no cut made is an alarm (the applier's uncontrollable), not a write that went through"
    assert fake.power_limit_w(0) == 450.0
    assert not [e for e in logs if e["event"] == "power_limit_floor"], "no floor at the limit in force"
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["power_limit_cannot_cut"]
    clock.advance(1.0)
    n = sets(fake)
    with pytest.raises(BackendError, match="cannot cut"):  # the next tick: the cut is asked again, once
        backend.write_knob(KNOB, 160.0)
    assert sets(fake) == n + 1
    fake.clear_injections()  # the refusal ends
    clock.advance(1.0)
    backend.write_knob(KNOB, 160.0)
    assert fake.power_limit_w(0) == 160.0
    backend.write_knob(KNOB, 155.0)  # later cuts and lowerings are written as asked
    assert fake.power_limit_w(0) == 155.0


def test_a_real_floor_lands_the_cut_is_asked_under_again_with_backoff_and_goes_when_the_driver_takes_less(
        make, clock):
    fake = two()
    backend = make(fake)
    fake.refuse_power_below(0, 250.0)  # F16: refused under 250 W although the constraints say 150 W
    backend.write_knob(KNOB, 150.0)
    floor = fake.power_limit_w(0)
    assert 250.0 <= floor <= 251.0
    searched = cut_every_second(backend, fake, clock, 150.0, 130)
    assert fake.power_limit_w(0) == floor
    assert searched == [1, 5, 13, 29, 61, 121], "asked under it 2 s later, doubling up to 60 s while it holds"
    fake.refuse_power_below(0, None)  # the driver takes the whole range now
    with structlog.testing.capture_logs() as logs:
        cut_every_second(backend, fake, clock, 150.0, 60)
    assert fake.power_limit_w(0) == 150.0, "the cut lands at the floor's next expiry"
    assert [e["event"] for e in logs if e["event"].startswith("power_limit")] == ["power_limit_floor_gone"]


def test_a_floor_above_a_limit_the_driver_took_before_is_not_trusted(make, clock):
    fake = two()
    backend = make(fake)
    backend.write_knob(KNOB, 200.0)  # taken
    backend.write_knob(KNOB, 450.0)
    fake.refuse_power_below(0, 300.0)  # now refused under 300 W: perhaps for a while only
    backend.write_knob(KNOB, 150.0)
    assert 300.0 <= fake.power_limit_w(0) <= 301.0  # as deep as it goes now
    searched = cut_every_second(backend, fake, clock, 150.0, 12)
    assert searched == [1, 3, 5, 7, 9, 11], "asked under it every 2 s, never later"


def test_a_floor_never_raises_the_limit_in_force(make, clock):
    fake = two()
    backend, other = make(fake), make(fake)  # another program on the same GPU (nvidia-smi -pl)
    fake.refuse_power_below(0, 250.0)
    backend.write_knob(KNOB, 150.0)  # a floor at ~250 W
    fake.refuse_power_below(0, None)
    other.write_knob(KNOB, 200.0)  # under the floor the daemon found
    backend.write_knob(KNOB, 180.0)  # a cut, while the floor holds
    assert fake.power_limit_w(0) == 180.0, "never above both the value asked and the limit in force"
    fake.refuse_power_below(0, 250.0)  # refused under 250 W again, with 180 W in force
    with pytest.raises(BackendError, match="cannot cut"):
        backend.write_knob(KNOB, 150.0)
    assert fake.power_limit_w(0) == 180.0, "the search never goes above the limit in force"


def test_a_gpu_reset_forgets_the_floor(make, clock):
    fake = two()
    backend = make(fake)
    fake.refuse_power_below(0, 250.0)
    backend.write_knob(KNOB, 150.0)
    cut_every_second(backend, fake, clock, 150.0, 14)  # confirmed three times: held 16 s from here
    fake.refuse_power_below(0, None)  # the reset brings a driver that takes its whole range
    fake.lose_gpu(0)
    clock.advance(1.0)
    assert backend.sample().lost == {"gpu0"}
    fake.revive_gpu(0)
    for _ in range(6):
        clock.advance(1.0)
        if not backend.sample().lost:
            break
    assert backend.sample().lost == frozenset() and fake.power_limit_w(0) == 450.0  # the driver's default
    backend.write_knob(KNOB, 150.0)  # within the old floor's hold: forgotten with the old probe
    assert fake.power_limit_w(0) == 150.0
