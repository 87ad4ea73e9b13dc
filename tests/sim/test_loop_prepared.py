"""A job's loads and stock twin prepared once (aithermd.sim.loop.prepare) give every run of it exactly what
stepping the workload and the twin inside the run gives: the benchmarks share them between baselines."""

from __future__ import annotations

import pytest

from aithermd.policy.loader import load_policy_text
from aithermd.sim import loop
from aithermd.sim.profiles import shipped_profiles
from aithermd.sim.workload import CycleWorkload

POLICY = """
machines:
  load:
    states:
      - name: idle
        enter: {metric: gpu.utilization_pct, stat: max, window_s: 30, below: 10}
      - name: busy
        enter: {metric: gpu.utilization_pct, stat: mean, window_s: 20, above: 50}
rules:
  - {name: search, kind: gpu_power_limit, when: {state: load.busy}, limit: efficient, measure_s: 30}
"""


def test_a_prepared_job_runs_as_the_job_itself():
    prof = shipped_profiles()["rtx3090"]
    w = CycleWorkload(idle_before_s=60, training_s=540, idle_after_s=0, seed=1002)
    prep = loop.prepare(prof, w, 600.0)
    assert len(prep.loads) == len(prep.twin) == 600
    pol = load_policy_text(POLICY, name="search")
    for kw in ({"policy": pol}, {"static_w": 250.0}):
        own, shared = loop.run(prof, w, 600.0, **kw), loop.run(prof, None, 600.0, prepared=prep, **kw)
        assert shared.changes == own.changes
        assert (shared.busy_energy_j, shared.busy_work) == (own.busy_energy_j, own.busy_work)
        assert shared.busy_stock_energy_j == pytest.approx(own.busy_stock_energy_j, rel=1e-12)
        assert shared.gain_pct() == pytest.approx(own.gain_pct(), abs=1e-9)
        assert shared.stock_work == pytest.approx(own.stock_work, rel=1e-12) and shared.stock_work > 0
    assert loop.run(prof, w, 600.0, policy=pol).changes  # the search did act in this job


def test_a_job_prepared_for_another_run_is_refused():
    prof = shipped_profiles()["rtx3090"]
    prep = loop.prepare(prof, CycleWorkload(seed=1), 120.0)
    with pytest.raises(ValueError, match="another card"):
        loop.run(prof, None, 240.0, prepared=prep)
    with pytest.raises(ValueError, match="another card"):
        loop.run(shipped_profiles()["rtx4090"], None, 120.0, prepared=prep)
    with pytest.raises(ValueError, match="needs a workload"):
        loop.run(prof, None, 120.0)
