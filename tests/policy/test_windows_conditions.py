"""Time-weighted windows and the three-valued conditions (metric, all/any/not, schedule, state)."""

from __future__ import annotations

import time

import pytest

from aithermd.policy.conditions import All, AnyOf, Ctx, Node, Not, Schedule
from aithermd.policy.schema import ScheduleCondition
from aithermd.policy.windows import Window


def filled(pairs, horizon=100.0):
    w = Window()
    for t, v in pairs:
        w = w.push(t, v, horizon)
    return w


def test_window_statistics_are_time_weighted():
    # 1 s of 10, then a 3 s gap closed by a sample of 50 (it covers the gap), then 1 s of 20
    w = filled([(0, 0), (1, 10), (4, 50), (5, 20)])
    assert w.stat("mean", 5, 5.0) == pytest.approx((10 * 1 + 50 * 3 + 20 * 1) / 5)
    assert w.stat("max", 5, 5.0) == 50 and w.stat("min", 5, 5.0) == 10
    assert w.stat("mean", 2, 5.0) == pytest.approx((50 + 20) / 2)
    assert w.stat("last", 0, 5.0) == 20


def test_window_is_unknown_until_full_and_trims_to_its_horizon():
    w = filled([(0, 1), (1, 1), (2, 1)], horizon=2)
    assert w.stat("mean", 3, 2.0) is None
    assert w.stat("mean", 2, 2.0) == 1
    w = filled([(float(t), float(t)) for t in range(100)], horizon=10)
    assert len(w.times) == 11 and w.times[0] == 89.0
    assert w.push(99.0, 5.0, 10) is w  # a time not after the last sample changes nothing


class Const(Node):
    __slots__ = ("value",)

    def __init__(self, value):
        super().__init__("c", 0.0)
        self.value = value

    def test(self, ctx):
        return self.value


def ctx(**kw):
    return Ctx(now=kw.pop("now", 0.0), t_wall=kw.pop("t_wall", 0.0), windows={}, ok=set(), **kw)


@pytest.mark.parametrize("parts, all_, any_", [
    ((True, True), True, True), ((True, False), False, True), ((True, None), None, True),
    ((False, None), False, None), ((None, None), None, None), ((False, False), False, False)])
def test_all_any_are_three_valued(parts, all_, any_):
    nodes = [Const(v) for v in parts]
    assert All("a", 0, nodes).eval(ctx()) is all_
    assert AnyOf("a", 0, nodes).eval(ctx()) is any_


def test_not_keeps_unknown_unknown():
    assert Not("n", 0, Const(None)).eval(ctx()) is None
    assert Not("n", 0, Const(True)).eval(ctx()) is False


def _wall(weekday_offset: int, hh: int, mm: int) -> float:
    # a local time on a known Monday (2025-06-02) plus days
    return time.mktime((2025, 6, 2 + weekday_offset, hh, mm, 0, 0, 0, -1))


@pytest.mark.parametrize("spec, day, hh, mm, expected", [
    ({"from": "09:00", "to": "17:00", "days": ["mon"]}, 0, 9, 0, True),
    ({"from": "09:00", "to": "17:00", "days": ["mon"]}, 0, 17, 0, False),
    ({"from": "09:00", "to": "17:00", "days": ["mon"]}, 1, 10, 0, False),
    ({"from": "22:00", "to": "07:00", "days": ["fri"]}, 4, 23, 30, True),
    ({"from": "22:00", "to": "07:00", "days": ["fri"]}, 5, 6, 59, True),   # Saturday early: Friday's night
    ({"from": "22:00", "to": "07:00", "days": ["fri"]}, 4, 6, 0, False),   # Friday early: Thursday's night
    ({"from": "22:00", "to": "07:00"}, 2, 12, 0, False),
])
def test_schedule_with_days_and_midnight_wrap(spec, day, hh, mm, expected):
    node = Schedule("s", ScheduleCondition.model_validate({"schedule": spec}))
    assert node.eval(ctx(t_wall=_wall(day, hh, mm))) is expected


def test_below_is_strict_and_above_inclusive_at_the_threshold():
    from aithermd.policy.conditions import Metric
    from aithermd.policy.schema import MetricCondition
    w = filled([(0, 10.0), (1, 10.0)])
    c = ctx(now=1.0)
    c.windows, c.ok = {"cpu/utilization": w}, {"cpu/utilization"}
    below = Metric("b", MetricCondition(metric="cpu.utilization_pct", stat="last", below=10), ["cpu/utilization"])
    above = Metric("a", MetricCondition(metric="cpu.utilization_pct", stat="last", above=10), ["cpu/utilization"])
    assert below.eval(c) is False and above.eval(c) is True
    c.ok = set()  # the reading failed this tick: unknown, neither
    assert below.eval(c) is None and above.eval(c) is None
