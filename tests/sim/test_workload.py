"""Workloads: the default idle → training → idle cycle and trace replay."""

import pytest

from aithermd.sim.workload import IDLE, TRAINING, CycleWorkload, TraceWorkload


def test_default_cycle_is_2_6_2_minutes():
    w = CycleWorkload()
    assert w.duration_s == 600
    phases = [w.phase(t) for t in range(600)]
    assert phases.count(IDLE) == 240 and phases.count(TRAINING) == 360
    assert phases[119] == IDLE and phases[120] == TRAINING and phases[479] == TRAINING and phases[480] == IDLE
    assert w.phase(600) == IDLE and w.phase(720) == TRAINING  # it repeats


def test_loads_by_phase():
    w = CycleWorkload(seed=3)
    idle = [w.gpu_util_pct(0, t) for t in range(0, 120)]
    train = [w.gpu_util_pct(0, t) for t in range(120, 480)]
    assert max(idle) <= 3
    assert sum(train) / len(train) > 90 and min(train) >= 30
    assert any(u < 70 for u in train)  # data-loader dips happen
    assert max(w.cpu_util_pct(t) for t in range(0, 120)) < 6 < min(w.cpu_util_pct(t) for t in range(120, 480))


def test_deterministic_per_seed_and_per_second():
    a, b, c = CycleWorkload(seed=1), CycleWorkload(seed=1), CycleWorkload(seed=2)
    assert [a.gpu_util_pct(1, t) for t in range(100, 500)] == [b.gpu_util_pct(1, t) for t in range(100, 500)]
    assert [a.gpu_util_pct(1, t) for t in range(120, 480)] != [c.gpu_util_pct(1, t) for t in range(120, 480)]
    assert a.gpu_util_pct(0, 200.1) == a.gpu_util_pct(0, 200.9)  # step length does not change the load


def test_gpus_are_not_in_lockstep():
    w = CycleWorkload()
    assert [w.gpu_util_pct(0, t) for t in range(120, 480)] != [w.gpu_util_pct(1, t) for t in range(120, 480)]


def test_trace_holds_values_between_samples_and_idles_after():
    w = TraceWorkload.from_rows([(100.0, [0, 5]), (101.0, [90, 95]), (102.0, [None, 40])])
    assert w.duration_s == 3.0
    assert w.gpu_util_pct(0, 0.5) == 0 and w.gpu_util_pct(0, 1.2) == 90 and w.gpu_util_pct(1, 1.99) == 95
    assert w.gpu_util_pct(0, 2.5) == 90  # None repeats the previous value
    assert w.gpu_util_pct(1, 2.5) == 40
    assert w.gpu_util_pct(0, 3.5) == 0 and w.phase(3.5) == IDLE
    assert w.gpu_util_pct(5, 1.5) == 95  # extra GPUs follow the last trace GPU
    assert w.phase(0.2) == IDLE and w.phase(1.5) == TRAINING


def test_trace_rejects_bad_input():
    with pytest.raises(ValueError):
        TraceWorkload.from_rows([])
    with pytest.raises(ValueError):
        TraceWorkload.from_rows([(2.0, [1]), (1.0, [1])])
