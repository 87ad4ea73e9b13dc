"""Schedules in local time: named schedules, workday/weekend/holiday, an IANA time zone, DST changes."""

import contextlib
import datetime as dt
import os
import time
from zoneinfo import ZoneInfo

import pytest

from aithermd.errors import PolicyErrors
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.schedules import Calendar, compile_periods, holds
from aithermd.policy.schema import Schedule
from tests.policy.machines import tick, workstation

BERLIN = ZoneInfo("Europe/Berlin")


@contextlib.contextmanager
def machine_zone(name: str):
    """The process's local zone set to ``name`` (TZ) for the block, then put back as it was."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def at(zone: ZoneInfo, *fields: int) -> float:
    return dt.datetime(*fields, tzinfo=zone).timestamp()


def periods(*specs: dict):
    return compile_periods([Schedule.model_validate(s) for s in specs])


def quiet_minutes(ps, cal, start: float, hours: int) -> int:
    return sum(holds(ps, cal, start + 60 * m) for m in range(hours * 60))


def test_quiet_hours_last_8_hours_the_night_clocks_go_forward_and_10_the_night_they_go_back():
    cal = Calendar("Europe/Berlin")
    night = periods({"from": "22:00", "to": "07:00"})
    spring = at(BERLIN, 2026, 3, 28, 12, 0)  # Saturday noon; 02:00 → 03:00 on Sunday the 29th
    autumn = at(BERLIN, 2026, 10, 24, 12, 0)  # 03:00 → 02:00 on Sunday the 25th
    ordinary = at(BERLIN, 2026, 3, 21, 12, 0)
    assert quiet_minutes(night, cal, ordinary, 24) == 9 * 60
    assert quiet_minutes(night, cal, spring, 24) == 8 * 60
    assert quiet_minutes(night, cal, autumn, 24) == 10 * 60
    # the instants themselves: 07:00 local is 05:00 UTC in summer time, 06:00 UTC in winter time
    assert holds(night, cal, at(ZoneInfo("UTC"), 2026, 3, 29, 4, 59)) is True
    assert holds(night, cal, at(ZoneInfo("UTC"), 2026, 3, 29, 5, 0)) is False
    assert holds(night, cal, at(ZoneInfo("UTC"), 2026, 10, 25, 5, 59)) is True
    assert holds(night, cal, at(ZoneInfo("UTC"), 2026, 10, 25, 6, 0)) is False


def test_a_window_inside_the_skipped_hour_never_holds_and_one_inside_the_repeated_hour_holds_twice():
    cal = Calendar("Europe/Berlin")
    skipped = periods({"from": "02:15", "to": "02:45"})
    assert quiet_minutes(skipped, cal, at(BERLIN, 2026, 3, 28, 12, 0), 24) == 0
    assert quiet_minutes(skipped, cal, at(BERLIN, 2026, 10, 24, 12, 0), 24) == 60


def test_an_explicit_zone_does_not_depend_on_the_machines_zone():
    pol = load_policy_text("""
timezone: America/New_York
rules:
  - {name: night, kind: gpu_power_limit, when: {schedule: {from: "22:00", to: "07:00"}}, limit: 200}
""", name="ny")
    devs = workstation(1)
    t = at(ZoneInfo("America/New_York"), 2026, 7, 1, 23, 0)
    answers = []
    for tz in ("UTC", "Asia/Tokyo"):
        with machine_zone(tz):
            r = evaluate(pol, (), tick(devs, 0.0, {}, t_wall=t), initial_state())
        answers.append(r.decisions.get("gpu0/power_limit"))
    assert answers[0] is not None and answers[0].value == answers[1].value == 200.0


def test_local_follows_the_machines_zone():
    night = periods({"from": "22:00", "to": "07:00"})
    t = at(ZoneInfo("UTC"), 2026, 7, 1, 23, 0)
    with machine_zone("UTC"):
        assert holds(night, Calendar("local"), t) is True
    with machine_zone("Asia/Tokyo"):  # 08:00 the next morning there
        assert holds(night, Calendar("local"), t) is False


@pytest.mark.parametrize("day, hh, expected", [
    ((2026, 12, 24), 23, True),   # Thursday, a holiday: the holiday evening
    ((2026, 12, 25), 8, True),    # Friday morning: still the holiday night (and the 25th is a holiday too)
    ((2026, 12, 28), 23, False),  # Monday: a workday evening is not a holiday one
    ((2026, 12, 26), 23, True),   # Saturday: weekend
])
def test_holidays_and_weekends(day, hh, expected):
    cal = Calendar("Europe/Berlin", ["12-24", "2026-12-25"])
    late = periods({"days": ["weekend", "holiday"], "from": "20:00", "to": "09:00"})
    assert holds(late, cal, at(BERLIN, *day, hh, 0)) is expected


def test_a_workday_is_monday_to_friday_and_not_a_holiday():
    cal = Calendar("Europe/Berlin", ["2026-12-25"])
    work = periods({"days": ["workday"], "from": "09:00", "to": "17:00"})
    assert holds(work, cal, at(BERLIN, 2026, 12, 24, 10, 0)) is True  # Thursday
    assert holds(work, cal, at(BERLIN, 2026, 12, 25, 10, 0)) is False  # Friday, a holiday
    assert holds(work, cal, at(BERLIN, 2026, 12, 26, 10, 0)) is False  # Saturday
    every_friday = periods({"days": ["fri"], "from": "09:00", "to": "17:00"})
    assert holds(every_friday, cal, at(BERLIN, 2026, 12, 25, 10, 0)) is True  # a named day is just that day


def test_named_schedules_are_used_by_name_and_a_missing_one_is_an_error():
    pol = load_policy_text("""
timezone: Europe/Berlin
schedules:
  quiet-hours:
    - {days: [workday], from: "22:00", to: "07:00"}
    - {days: [weekend], from: "20:00", to: "09:00"}
rules:
  - {name: q, kind: gpu_power_limit, when: {schedule: quiet-hours}, limit: 200}
""", name="named")
    devs = workstation(1)
    friday_2130, saturday_2130 = at(BERLIN, 2026, 1, 2, 21, 30), at(BERLIN, 2026, 1, 3, 21, 30)
    assert "gpu0/power_limit" not in evaluate(pol, (), tick(devs, 0.0, {}, t_wall=friday_2130),
                                              initial_state()).decisions
    assert evaluate(pol, (), tick(devs, 0.0, {}, t_wall=saturday_2130),
                    initial_state()).decisions["gpu0/power_limit"].value == 200.0
    with pytest.raises(PolicyErrors) as err:
        load_policy_text("""
schedules:
  quiet-hours: [{from: "22:00", to: "07:00"}]
rules:
  - {name: q, kind: gpu_power_limit, when: {schedule: quiet-hour}, limit: 200}
""", name="typo")
    assert "no schedule named 'quiet-hour'" in str(err.value) and "did you mean 'quiet-hours'" in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("timezone: Europe/Berlinn\n", "unknown time zone 'Europe/Berlinn'"),
    ("holidays: ['2026-02-30']\n", "'2026-02-30' is not a date"),
    ("holidays: [christmas]\n", "'christmas' is not a date"),
    ("timezone: '../../etc/passwd'\n", "unknown time zone '../../etc/passwd'"),
    ("timezone: ''\n", "unknown time zone ''"),
    ("schedules:\n  q: [{days: [mon], from: '22:00', to: '22:00'}]\n",
     "schedules.q[0]: from 22:00 to 22:00 is an empty window; for all day write from: \"00:00\", to: \"24:00\""),
    ("rules:\n  - {name: x, kind: cpu_knobs, when: {schedule: {from: '24:00', to: '00:00'}}, boost: true}\n",
     "rules[0].when.schedule: from 24:00 to 00:00 is an empty window"),
])
def test_bad_calendar_keys_are_refused_with_what_to_write(text, message):
    with pytest.raises(PolicyErrors) as err:
        load_policy_text(text, name="bad")
    assert message in str(err.value)


def test_the_shipped_workstation_policy_is_quiet_at_night_and_on_holidays():
    from pathlib import Path

    from aithermd.policy.loader import load_policy_file
    pol = load_policy_file(Path(__file__).parents[2] / "policies" / "workstation.yaml")
    with machine_zone("Europe/Berlin"):  # the shipped policy runs on the machine's own zone
        cal = Calendar(pol.document.timezone, pol.document.holidays)
        quiet = compile_periods(pol.document.schedules["quiet-hours"])
        assert holds(quiet, cal, at(BERLIN, 2026, 12, 24, 20, 30))  # Thursday, Christmas Eve
        assert not holds(quiet, cal, at(BERLIN, 2026, 12, 23, 20, 30))  # Wednesday evening
        assert holds(quiet, cal, at(BERLIN, 2026, 12, 23, 23, 0))
