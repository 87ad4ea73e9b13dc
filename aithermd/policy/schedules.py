"""Schedules in local time: days, times of day, holidays, one time zone, DST included. Pure.

A :class:`Calendar` turns the engine's wall-clock time (s since the epoch, from the tick's input, so a
replay sees the same answer) into a local date and minute of the day in the policy's ``timezone``:
an IANA zone through :mod:`zoneinfo`, or ``local`` — the machine's own zone through the C library's
``localtime`` (``/etc/localtime``, or ``TZ``; a new ``/etc/localtime`` is read again within a minute by the
running daemon: :mod:`aithermd.runtime.localzone`). Both follow the zone's DST rules: on the night clocks go
forward, 22:00–07:00 lasts 8 hours; on the night they go back, 10; an hour that happens twice counts as
its local minute both times.

A window ``from`` > ``to`` wraps past midnight, and the hours after midnight belong to the day it started
on (Friday 22:00–07:00 holds until Saturday 07:00). Day words: ``mon`` … ``sun``; ``workday`` — Monday to
Friday and not a holiday; ``weekend`` — Saturday and Sunday; ``holiday`` — a date of the policy's
``holidays`` (``YYYY-MM-DD``, or ``MM-DD`` every year).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aithermd.policy.kinds import DAYS, parse_holiday

MINUTES_PER_DAY = 1440


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


class Calendar:
    """Local time and holidays of one policy. :meth:`local` keeps its last answer (one per tick)."""

    __slots__ = ("zone", "name", "dates", "yearly", "_t", "_local")

    def __init__(self, timezone: str = "local", holidays: Iterable[str] = ()) -> None:
        self.name = timezone
        if timezone == "local":
            self.zone = None
        else:
            from zoneinfo import ZoneInfo
            self.zone = ZoneInfo(timezone)
        dates, yearly = set(), set()
        for text in holidays:
            year, month, day = parse_holiday(text)
            if year is None:
                yearly.add((month, day))
            else:
                dates.add(dt.date(year, month, day))
        self.dates, self.yearly = frozenset(dates), frozenset(yearly)
        self._t: float | None = None
        self._local: tuple[dt.date, int] = (dt.date(1970, 1, 1), 0)

    def local(self, t_wall: float) -> tuple[dt.date, int]:
        """(local date, minute of the day 0–1439) at ``t_wall``."""
        if t_wall != self._t:
            if self.zone is None:
                lt = time.localtime(t_wall)
                self._local = (dt.date(lt.tm_year, lt.tm_mon, lt.tm_mday), lt.tm_hour * 60 + lt.tm_min)
            else:
                d = dt.datetime.fromtimestamp(t_wall, self.zone)
                self._local = (d.date(), d.hour * 60 + d.minute)
            self._t = t_wall
        return self._local

    def is_holiday(self, day: dt.date) -> bool:
        return day in self.dates or (day.month, day.day) in self.yearly


@dataclass(frozen=True, slots=True)
class Period:
    """One window: ``weekdays`` (0 = Monday), ``words`` (workday/weekend/holiday), minutes [start, end)."""

    weekdays: frozenset[int]
    words: frozenset[str]
    start: int
    end: int

    def day_matches(self, day: dt.date, cal: Calendar) -> bool:
        wd = day.weekday()
        if wd in self.weekdays:
            return True
        words = self.words
        if not words:
            return False
        if "weekend" in words and wd >= 5:
            return True
        holiday = ("holiday" in words or "workday" in words) and cal.is_holiday(day)
        if "holiday" in words and holiday:
            return True
        return "workday" in words and wd < 5 and not holiday


def compile_periods(schedules: Sequence[Any]) -> tuple[Period, ...]:
    """:class:`Period` per schema ``Schedule`` (``days``, ``from_``, ``to``)."""
    out = []
    for s in schedules:
        days = [d for d in s.days if d in DAYS]
        out.append(Period(frozenset(DAYS.index(d) for d in days), frozenset(d for d in s.days if d not in DAYS),
                          _minutes(s.from_), _minutes(s.to)))
    return tuple(out)


def holds(periods: Sequence[Period], cal: Calendar, t_wall: float) -> bool:
    """True when local time at ``t_wall`` is inside any of ``periods``."""
    day, minute = cal.local(t_wall)
    yesterday: dt.date | None = None
    for p in periods:
        if p.start <= p.end:
            if p.start <= minute < p.end and p.day_matches(day, cal):
                return True
            continue
        if minute >= p.start and p.day_matches(day, cal):
            return True
        if minute < p.end:
            yesterday = yesterday or day - dt.timedelta(days=1)
            if p.day_matches(yesterday, cal):
                return True
    return False
