"""The node power budget on the simulated workstation: the real daemon, 2–8 GPUs, phase-shifted jobs.

Every check reads what reached the machine (the fake NVML's limits, the board's RAPL files) through
:class:`aithermd.sim.budget_watch.BudgetWatch`, never the daemon's own arithmetic. The GPUs are RTX 4090s
from a real 8-GPU server's ``nvidia-smi -q`` (150–450 W limits), training Zeus-calibrated jobs."""

import asyncio
from pathlib import Path

import pytest

from aithermd.settings import DaemonSettings
from aithermd.sim.profiles import load_profiles
from aithermd.sim.runner import SimOptions, simulate
from aithermd.sim.staggered import StaggeredWorkload
from aithermd.sim.workload import CycleWorkload
from tests.sim.conftest import NOON, SEED

DUMP = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-q" / "rtx4090-x8-nvidia-smi-q.txt"
PER_GPU_W = 300.0  # the budget: 300 W a GPU (of their 450 W) and the CPU's share comes out of it too


def budget_policy(directory: Path, devices_w: float, name: str = "budgeted") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(f"""
budget: {{devices_w: {devices_w:g}}}
machines:
  load:
    per: gpu
    states:
      - name: idle
        enter: {{metric: gpu.utilization_pct, stat: max, window_s: 30, below: 10}}
      - name: training
        enter: {{metric: gpu.utilization_pct, stat: mean, window_s: 10, above: 40}}
        min_dwell_s: 30
rules:
  - {{name: train, kind: gpu_power_limit, when: {{state: load.training}}, limit: max}}
  - {{name: rest, kind: gpu_power_limit, when: {{state: load.idle}}, limit: 80%}}
""")
    return directory


def static_policy(directory: Path, limit_w: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "static.yaml").write_text(f"""
rules:
  - {{name: fixed-share, kind: gpu_power_limit, limit: {limit_w:g}}}
""")
    return directory


def run(tmp_path, policy: str, dirs: Path, gpus: int, workload, duration_s: float, listeners=()):
    profiles = load_profiles([DUMP])[:gpus]
    settings = DaemonSettings(policy=policy, policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error", policy_dirs=[dirs])
    opts = SimOptions(duration_s=duration_s, speedup=0, seed=SEED, wall_start=NOON, workload=workload,
                      profiles=profiles, state_dir=tmp_path / f"state-{policy}-{gpus}", listeners=listeners)
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0
    return result.data


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_limits_in_force_stay_within_the_budget_at_every_tick(tmp_path, gpus):
    """Jobs start 150 s apart, so one to all of the GPUs train at once, and end one after another."""
    load = StaggeredWorkload.every(CycleWorkload(seed=SEED), 150.0, gpus)
    data = run(tmp_path, "budgeted", budget_policy(tmp_path / "p", PER_GPU_W * gpus), gpus, load, 1200)
    b = data["budget"]
    assert b["ticks"] >= 1200 and b["over"] == 0, b
    assert b["max_in_force_w"] <= b["budget_w"] + 0.5
    assert b["max_in_force_w"] >= 0.97 * b["budget_w"]  # and it is used, not left on the table
    limits = {name: {round(c[2]) for c in g["limit_changes"]} for name, g in data["gpus"].items()}
    assert all(len(v) > 1 for v in limits.values())  # every GPU's limit moved with the split


def test_work_is_not_lost_when_one_gpu_idles(tmp_path):
    """Four GPUs under a 1200 W budget, the fourth idle throughout: the three busy ones get its share.
    Against the same three with a fixed equal split of the budget (what a static cap per GPU does, the
    idle GPU's part lost), they get more power and train more."""
    idle_fourth = StaggeredWorkload(CycleWorkload(idle_before_s=30, training_s=1800, idle_after_s=0, seed=SEED),
                                    (0.0, 0.0, 0.0, 1e9))
    budgeted = run(tmp_path, "budgeted", budget_policy(tmp_path / "p", 1200.0), 4, idle_fourth, 600)
    share = budgeted["budget"]["devices"]
    fixed_share = (1200.0 - 119.0) / 4  # the CPU package at its 118.75 W PL2, the rest in four
    static = run(tmp_path, "static", static_policy(tmp_path / "s", fixed_share), 4, idle_fourth, 600)
    busy = ("gpu0", "gpu1", "gpu2")
    assert all(share[g]["mean_allotted_w"] > 1.1 * fixed_share for g in busy), share
    left = 1200.0 - share["gpu3"]["mean_allotted_w"] - share["powercap:package-0"]["mean_allotted_w"]
    assert sum(share[g]["mean_allotted_w"] for g in busy) >= 0.95 * left  # what the idle GPU left is used
    work = {name: sum(run_["gpus"][g]["work"] for g in busy) for name, run_ in (("budget", budgeted),
                                                                              ("static", static))}
    assert work["budget"] > 1.02 * work["static"], work


def test_an_arriving_job_takes_its_share_within_a_window(tmp_path):
    """Two GPUs under 600 W: GPU 1's job arrives 300 s after GPU 0's. Within the split's 10 s window
    (in practice two ticks: one for GPU 0 to come down, one for GPU 1 to go up) GPU 1's limit reaches 90 %
    of the share it holds once both train."""
    seen: list[tuple[float, dict]] = []

    def listen(snapshot, _events):
        if snapshot.budget:
            seen.append((snapshot.t_mono, {d: e["allotted_w"] for d, e in snapshot.budget["devices"].items()}))

    load = StaggeredWorkload(CycleWorkload(idle_before_s=60, training_s=1800, idle_after_s=0, seed=SEED),
                             (0.0, 300.0))
    data = run(tmp_path, "budgeted", budget_policy(tmp_path / "p", 600.0), 2, load, 540, listeners=[listen])
    assert data["budget"]["over"] == 0
    t0 = seen[0][0]
    arrival = 360.0  # its idle 60 s, shifted by 300 s
    before = [a for t, a in seen if arrival - 30 <= t - t0 < arrival]
    after = [(t - t0, a) for t, a in seen if t - t0 >= arrival]
    assert max(a["gpu1"] for a in before) <= 0.75 * max(a["gpu0"] for a in before)  # idle: little
    fair = after[-1][1]["gpu1"]
    assert fair >= 0.8 * after[-1][1]["gpu0"]  # at the end both train: a like share
    took = next(t for t, a in after if a["gpu1"] >= 0.9 * fair) - arrival
    assert took <= 10.0, took
