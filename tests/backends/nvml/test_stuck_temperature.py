"""attack5 C1 through the NVML backend over the fake NVML and the sensor trust (fake time, one read a second):
a GPU die temperature frozen at a plausible value, or colder than its draw allows, is implausible — held
once, then a confirmed failure — while a healthy idle card, a live one through a load step and one held
flat by its firmware at its thermal target are never judged."""

from __future__ import annotations

from aithermd.backends.trust import SensorTrust
from aithermd.model import Status

TEMP, POWER = "gpu0/temperature", "gpu0/power"  # the RTX 4090 (slowdown 87 °C)


def reader(workstation, backend_over):
    backend = backend_over(workstation)
    trust = SensorTrust()
    trust.configure(backend.devices())
    t = [0.0]

    def read(temp_c: float, power_w: float):
        workstation.set_dynamic(0, temp_c=temp_c, power_draw_w=power_w)
        t[0] += 1.0
        return trust.filter(t[0], backend.sample().readings)[TEMP]

    return read


def test_a_die_colder_than_its_draw_allows_is_held_once_then_failed(workstation, backend_over):
    """3 °C at 208 W (attack5 C1: 40 → 3 °C under a cut): under 1 °C + 0.025 K/W × 208 W = 6.2 °C."""
    read = reader(workstation, backend_over)
    assert read(40.0, 208.0).value == 40.0
    held = read(3.0, 208.0)
    assert (held.status, held.value) == (Status.OK, 40.0) and "under the 6.2 °C" in held.detail  # one glitch
    failed = read(3.0, 208.0)
    assert (failed.status, failed.value) == (Status.IMPLAUSIBLE, None)
    assert read(3.0, 20.0).value == 3.0  # an idle card in a cold room: 1.5 °C allowed


def test_a_reading_frozen_through_a_draw_step_is_stuck(workstation, backend_over):
    """40 °C bit-identical while the draw goes 208 → 330 W and stays: a die moves ≥ 3 °C within seconds."""
    read = reader(workstation, backend_over)
    assert all(read(40.0, 208.0).value == 40.0 for _ in range(60))
    seen = [read(40.0, 330.0) for _ in range(10)]
    status = [r.status for r in seen]
    assert Status.IMPLAUSIBLE in status, [r.detail for r in seen]
    first = status.index(Status.IMPLAUSIBLE)
    assert first <= 6 and seen[first - 1].detail.startswith("held: implausible: stuck: 40 °C")  # held once
    assert all(s is Status.IMPLAUSIBLE for s in status[first:])
    assert read(41.0, 330.0).status is Status.OK  # it moves again: a reading


def test_a_frozen_reading_under_a_slower_draw_change_is_stuck_within_minutes(workstation, backend_over):
    """40 °C while the draw, ±8 W a second, creeps 190 → 260 W (attack5 C1's job under a release ramp): two
    minute means 70 W apart move a die and its heatsink ≥ 2 °C."""
    read = reader(workstation, backend_over)
    draw = [190.0] * 60 + [190.0 + 70.0 * i / 60.0 for i in range(60)] + [260.0] * 120
    seen = [read(40.0, w + (8.0 if i % 2 else -8.0)) for i, w in enumerate(draw)]
    status = [r.status for r in seen]
    assert status[:90] == [Status.OK] * 90 and Status.IMPLAUSIBLE in status, status  # within 2 minutes


def test_healthy_cards_are_never_judged(workstation, backend_over):
    read = reader(workstation, backend_over)
    idle = [read(33.0, 25.0 + (i % 5)) for i in range(1800)]  # half an hour idle, one whole degree
    assert {(r.status, r.value) for r in idle} == {(Status.OK, 33.0)}
    read = reader(workstation, backend_over)
    live = [read(35.0 + min(14.0, i * 5.0), 330.0) for i in range(120)]  # a load step, then steady
    assert all(r.status is Status.OK for r in live)
    read = reader(workstation, backend_over)
    target = [read(83.0, 250.0 + 2.0 * i) for i in range(300)]  # firmware holding 83 °C (max_operating 84)
    assert all(r.status is Status.OK and r.value == 83.0 for r in target)
