"""The safety layer on four simulated H100s whose temperature hovers at its trip point: the real daemon,
a policy with a GPU temperature ceiling the training load reaches. The old layer swung each limit between
maximum and minimum ~90 times in 20 minutes, at times every second; now each change waits its hold, cuts in
proportion and releases after 30 s three degrees under."""

from __future__ import annotations

import collections

from aithermd.sim.profiles import shipped_profiles
from tests.sim.conftest import long_training_load, run_daemon

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
