"""The daemon's tests set up alike: three stub policies (:mod:`tests.support.stub_engine`) and settings in a
temp dir, no bus, no exporter, no NVML. Their conftests import these fixtures (the clock is the suite's)."""

from __future__ import annotations

import pytest

from aithermd.settings import DaemonSettings
from tests.support.stub_engine import write_policy


@pytest.fixture
def policy_dir(tmp_path):
    """``balanced`` (fans at 60 %), ``quiet`` (30 %) and ``handsoff`` (hands the fans back)."""
    d = tmp_path / "policies"
    write_policy(d, "balanced", 60.0)
    write_policy(d, "quiet", 30.0)
    write_policy(d, "handsoff", None)
    return d


@pytest.fixture
def settings(tmp_path, policy_dir) -> DaemonSettings:
    return DaemonSettings(state_dir=tmp_path / "state", policy_dirs=[policy_dir], bus="none",
                          metrics_listen="none", nvml=False, sysfs_root=tmp_path / "nosys")
