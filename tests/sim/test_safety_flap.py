"""The safety layer on four simulated H100s whose temperature hovers at its trip point: the real daemon,
a policy with a GPU temperature ceiling the training load reaches. The old layer swung each limit between
maximum and minimum ~90 times in 20 minutes, at times every second; now each change waits its hold, cuts in
proportion and releases after 30 s three degrees under."""

from __future__ import annotations

import collections
from pathlib import Path

from aithermd.sim.profiles import shipped_profiles
from aithermd.sim.workload import CycleWorkload
from tests.sim.conftest import SEED, long_training_load, run_daemon

CRITICAL = "safety/critical-temperature"
HOT = """
description: ai-training with a GPU temperature ceiling the load reaches
safety: {gpu_temp_limit_c: 50}
machines:
  load:
    states:
      - name: idle
        enter: {metric: gpu.utilization_pct, stat: max, window_s: 60, below: 10}
      - name: training
        enter: {metric: gpu.utilization_pct, stat: mean, window_s: 20, above: 40}
        min_dwell_s: 30
rules:
  - {name: training-limit, kind: gpu_power_limit, when: {state: load.training}, limit: max}
"""


def test_a_temperature_at_its_trip_point_changes_each_limit_at_most_6_times_a_minute(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hot.yaml").write_text(HOT)
    h100 = shipped_profiles()["h100"]
    run = run_daemon(tmp_path, "hot", 1500, long_training_load(), policy_dirs=[tmp_path / "policies"],
                     profiles=[h100] * 4).data
    per_minute: collections.Counter = collections.Counter()
    safety_cuts = 0
    for a in run["actuations"]:
        if a["knob"].endswith("/power_limit"):
            per_minute[(a["knob"], int(a["t_s"] // 60))] += 1
            if a["rule"].startswith("safety/"):
                safety_cuts += 1
                assert a["new"] > 200.0, a  # cut in proportion to the draw, never straight to the minimum
    assert safety_cuts > 0, "the load never reached the ceiling: nothing was tested"
    assert max(per_minute.values()) <= 6, per_minute.most_common(3)
    for gpu in run["gpus"].values():
        assert gpu["peak_temp_c"] < 60.0


def test_a_released_cut_climbs_back_in_steps_instead_of_jumping_to_the_policys_limit(tmp_path):
    """Issue 18 §3 (attack report F6): ``balanced`` with a 52 °C GPU ceiling its cards reach. The latch's
    release handed each limit straight back to the policy (the efficient search measuring at the default),
    which re-tripped within seconds: 450 → 283 → 450 → 366 W … Now the released cut is a ceiling that rises
    5 % of the maximum per 30 s of calm (policy/safety_ramp.py)."""
    policy = (Path(__file__).parents[2] / "policies" / "balanced.yaml").read_text()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hot.yaml").write_text(
        policy.replace("\nrules:", "\nsafety: {gpu_temp_limit_c: 52}\n\nrules:", 1))
    run = run_daemon(tmp_path, "hot", 900, CycleWorkload(30, 900, 30, seed=SEED),
                     policy_dirs=[tmp_path / "policies"]).data
    moves: dict[str, list[tuple[float, float, float, str]]] = collections.defaultdict(list)
    for a in run["actuations"]:
        if a["knob"].endswith("/power_limit"):
            moves[a["knob"]].append((a["t_s"], a["old"], a["new"], a["rule"]))
    cut = {k: next(t for t, *_r, rule in m if rule == CRITICAL)
           for k, m in moves.items() if any(rule == CRITICAL for *_x, rule in m)}
    assert cut, "no card reached its trip point: nothing was tested"
    for knob, first in cut.items():
        step = 0.05 * run["gpus"][knob.split("/")[0]]["max_limit_w"]
        after = [m for m in moves[knob] if m[0] > first]
        ups = [(t, old, new, rule) for t, old, new, rule in after if new > old]
        assert all(new - old <= step + 0.01 for _t, old, new, _r in ups), ups  # steps, never a jump back
        for t, *_x in ups:  # and no step re-trips within seconds
            assert not [m for m in after if t < m[0] <= t + 10 and m[3] == CRITICAL], after
        per_minute = collections.Counter(int(t // 60) for t, *_x in moves[knob])
        assert max(per_minute.values()) <= 2, (knob, per_minute)
