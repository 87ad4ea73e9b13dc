"""An NTP step of the wall clock (±8 h: an RTC kept in local time on a dual-boot machine; +25 h: a dead CMOS
battery) neither stretches nor cuts a timed override or hold (attack4 B4), and a restart after the step
still ends them on time. The clock is the tests' FakeClock: monotonic and boot time run on,
the wall clock steps."""

from __future__ import annotations

import json

import pytest

from aithermd.runtime.control import STATE_FILE
from tests.runtime.test_control import make, policies  # noqa: F401, F811 - policies: the fixture

STEPS = (-8 * 3600.0, 8 * 3600.0, 25 * 3600.0)


def _ends(op, clock, minutes: int) -> dict[str, int]:
    """Minute by minute from now: the minute (since the override was set) each one ended."""
    ended: dict[str, int] = {}
    for _ in range(minutes):
        clock.advance(60.0)
        op.expire(clock.wall())
        m = round((clock.monotonic() - 1000.0) / 60.0)
        if "override" not in ended and "gpu0/power_limit" not in op.override_values():
            ended["override"] = m
        if "hold" not in ended and not op.holds:
            ended["hold"] = m
    return ended


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("restart", [False, True])
def test_override_and_hold_last_what_they_were_given(tmp_path, clock, policies, step, restart):  # noqa: F811
    assert clock.monotonic() == 1000.0
    op = make(tmp_path, clock, policies)
    op.set_override("gpu0/power_limit", 150.0, 15 * 60)  # aithermctl override ... --for 15m
    op.hold_policy("quiet", "meeting", 3600.0, "detached", 0, True)  # hold quiet --timeout 1h --detach
    clock.advance(60.0)
    op.expire(clock.wall())
    clock.step_wall(step)  # one minute in, NTP steps the wall clock
    clock.advance(60.0)
    op.expire(clock.wall())
    (hold,) = op.holds  # shown by the wall clock as it is now: 58 min from now
    assert hold.expires == pytest.approx(clock.wall() + 58 * 60)
    if restart:  # two minutes in: the daemon restarts (same state directory), the expiry still holds
        saved = json.loads((tmp_path / "state" / STATE_FILE).read_text())
        assert saved["overrides"]["gpu0/power_limit"]["expires_wall"] == pytest.approx(clock.wall() + 13 * 60)
        op = make(tmp_path, clock, policies)
        assert op.override_values() == {"gpu0/power_limit": 150.0} and len(op.holds) == 1
    assert _ends(op, clock, 120) == {"override": 15, "hold": 60}
