"""The split of one device's interval energy: values, bases, and that it always adds up."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aithermd.accounting.attribution import EVEN, MEMORY, UTILIZATION, Holder, IdleFloor, split_cpu, split_gpu


def _sum(split):
    return sum(s.total_j for s in split.shares) + split.idle_j + split.unattributed_j


def test_two_jobs_sharing_a_gpu_by_utilization():
    # 10 s at 350 W on a card idling at 30 W: 300 J idle, 3200 J active; A busy 3x as much as B
    split = split_gpu("gpu0", 3500.0, 10.0, 30.0, [Holder("A", 300.0, 8 << 30), Holder("B", 100.0, 1 << 30)])
    a, b = split.shares
    assert split.basis == UTILIZATION
    assert a.active_j == pytest.approx(2400.0) and b.active_j == pytest.approx(800.0)
    assert a.idle_j == b.idle_j == pytest.approx(150.0)  # the holders share the idle floor evenly
    assert _sum(split) == pytest.approx(3500.0)


def test_idle_holder_is_not_charged_for_the_busy_one():
    split = split_gpu("gpu0", 3500.0, 10.0, 30.0, [Holder("A", 500.0, 1 << 30), Holder("B", 0.0, 20 << 30)])
    a, b = split.shares
    assert b.active_j == 0.0 and a.active_j == pytest.approx(3200.0)


def test_no_utilization_falls_back_to_memory_then_even():
    mem = split_gpu("gpu0", 1000.0, 10.0, 0.0, [Holder("A", None, 3 << 30), Holder("B", None, 1 << 30)])
    assert mem.basis == MEMORY and [s.active_j for s in mem.shares] == pytest.approx([750.0, 250.0])
    # utilization supported but nobody busy (a held card above its floor): memory too
    held = split_gpu("gpu0", 1000.0, 10.0, 0.0, [Holder("A", 0.0, 1 << 30), Holder("B", 0.0, 1 << 30)])
    assert held.basis == MEMORY
    even = split_gpu("gpu0", 1000.0, 10.0, 0.0, [Holder("A", None, None), Holder("B", None, None)])
    assert even.basis == EVEN and [s.active_j for s in even.shares] == pytest.approx([500.0, 500.0])


def test_nobody_holds_the_gpu():
    split = split_gpu("gpu0", 400.0, 10.0, 30.0, [])
    assert split.shares == () and split.idle_j == 300.0 and split.unattributed_j == 100.0


def test_idle_part_never_exceeds_the_energy():
    split = split_gpu("gpu0", 100.0, 10.0, 30.0, [Holder("A", 50.0, 1)])
    assert split.shares[0].idle_j == 100.0 and split.shares[0].active_j == 0.0


def test_cpu_by_cpu_time_and_idle_to_the_machine():
    split = split_cpu("cpu", 650.0, 10.0, 25.0, {"A": 6.0, "B": 2.0, "C": 0.0})
    assert split.idle_j == 250.0
    assert {s.key: s.active_j for s in split.shares} == pytest.approx({"A": 300.0, "B": 100.0})
    assert split_cpu("cpu", 650.0, 10.0, 25.0, {}).unattributed_j == 400.0


def test_nonsense_inputs_are_zero_not_nan():
    split = split_gpu("gpu0", float("nan"), 10.0, 30.0, [Holder("A", float("inf"), -5)])
    assert split.energy_j == 0.0 and all(math.isfinite(s.total_j) for s in split.shares)


holder = st.builds(Holder, st.integers(0, 50), st.one_of(st.none(), st.floats(0, 1e4)),
                   st.one_of(st.none(), st.integers(0, 1 << 40)))


@given(st.floats(0, 1e7), st.floats(0.01, 3600), st.one_of(st.none(), st.floats(0, 2000)),
       st.lists(holder, max_size=8, unique_by=lambda h: h.key))
def test_gpu_split_always_adds_up(energy, dt, floor, holders):
    split = split_gpu("gpu0", energy, dt, floor, holders)
    assert _sum(split) == pytest.approx(energy, rel=1e-9, abs=1e-6)
    assert all(s.active_j >= 0 and s.idle_j >= 0 for s in split.shares)


@given(st.floats(0, 1e7), st.floats(0.01, 3600), st.one_of(st.none(), st.floats(0, 500)),
       st.dictionaries(st.integers(0, 100), st.floats(0, 1e5), max_size=20))
def test_cpu_split_always_adds_up(energy, dt, floor, cpu):
    assert _sum(split_cpu("cpu", energy, dt, floor, cpu)) == pytest.approx(energy, rel=1e-9, abs=1e-6)


def test_idle_floor_drops_fast_and_rises_slowly():
    floor = IdleFloor()
    assert floor.observe(300.0, 5.0, idle=False) is None  # started under load: the load is not the floor
    assert floor.observe(40.0, 5.0, idle=True) == 40.0
    assert floor.observe(300.0, 5.0, idle=False) == 40.0  # busy: no rise
    assert floor.observe(30.0, 5.0, idle=False) == 30.0  # a busy card below the floor: floor too high
    assert floor.observe(31.0, 36.0, idle=True) == pytest.approx(30.01)  # 1 % of the gap in 36 s of an hour
    assert floor.observe(float("nan"), 5.0, idle=True) == pytest.approx(30.01)
