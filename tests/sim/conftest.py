"""Shared runs of the daemon on the simulated workstation (in process, no waiting: ~2 s per 10 minutes)."""

import asyncio
from pathlib import Path

import pytest

from aithermd.settings import DaemonSettings
from aithermd.sim.machine import SimulatedMachine
from aithermd.sim.runner import SimOptions, SimResult, simulate
from aithermd.sim.workload import CycleWorkload, Workload

NOON = 1_767_268_800.0  # 2026-01-01 12:00 UTC: daytime, so quiet's night rule stays out of the way
POLICIES = ("balanced", "ai-training", "quiet")
SEED = 3


def run_daemon(tmp_path, policy: str, duration_s: float, workload: Workload | None = None,
               policy_dirs: list | None = None, **kw) -> SimResult:
    settings = DaemonSettings(policy=policy, policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error", policy_dirs=policy_dirs)
    opts = SimOptions(duration_s=duration_s, speedup=0, seed=SEED, wall_start=NOON,
                      workload=workload or CycleWorkload(seed=SEED),
                      state_dir=tmp_path / f"state-{policy}", **kw)
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0, f"{policy}: the daemon exited {result.code}"
    return result


def hot_policy(tmp_path: Path, limit_c: float) -> Path:
    """A policy directory holding ``hot``: the shipped ai-training policy with a GPU ceiling of ``limit_c``
    °C, one the simulated load reaches."""
    policy = (Path(__file__).parents[2] / "policies" / "ai-training.yaml").read_text()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hot.yaml").write_text(
        policy.replace("\nmachines:", f"\nsafety: {{gpu_temp_limit_c: {limit_c:g}}}\n\nmachines:", 1))
    return tmp_path / "policies"


def run_stock(tmp_path, duration_s: float, workload: Workload | None = None) -> dict:
    """The same machine and load with no daemon: default limits, fans under their own automatic control."""
    m = SimulatedMachine(tmp_path / "stock", workload=workload or CycleWorkload(seed=SEED), seed=SEED)
    while m.t_s < duration_s:
        m.step(1.0)
    summary = m.summary()
    m.close()
    return summary


@pytest.fixture(scope="session")
def default_cycle_runs(tmp_path_factory) -> dict[str, dict]:
    """One full default cycle (idle 2, training 6, idle 2 minutes) per shipped policy, and stock."""
    base = tmp_path_factory.mktemp("cycle")
    runs = {policy: run_daemon(base, policy, 600).data for policy in POLICIES}
    runs["stock"] = run_stock(base, 600)
    return runs


def long_training_load() -> Workload:
    """25 minutes of training between idle spells: long enough to reach steady state."""
    return CycleWorkload(idle_before_s=120, training_s=1500, idle_after_s=300, seed=SEED)


@pytest.fixture(scope="session")
def long_training_runs(tmp_path_factory) -> dict[str, dict]:
    """The long training load (:func:`long_training_load`), per shipped policy."""
    base = tmp_path_factory.mktemp("long")
    return {policy: run_daemon(base, policy, 1920, long_training_load()).data for policy in POLICIES}
