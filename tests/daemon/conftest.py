"""Fixtures for the daemon tests: policies and settings in a temp dir (the clock is the suite's)."""

from __future__ import annotations

import pytest

from aithermd.settings import DaemonSettings

from .stub_engine import write_policy


@pytest.fixture
def policy_dir(tmp_path):
    d = tmp_path / "policies"
    write_policy(d, "balanced", 60.0)
    write_policy(d, "quiet", 30.0)
    write_policy(d, "handsoff", None)
    return d


@pytest.fixture
def settings(tmp_path, policy_dir) -> DaemonSettings:
    return DaemonSettings(state_dir=tmp_path / "state", policy_dirs=[policy_dir], bus="none",
                          metrics_listen="none", nvml=False, sysfs_root=tmp_path / "nosys")
