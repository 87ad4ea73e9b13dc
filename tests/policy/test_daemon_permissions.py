"""The daemon running as root refuses a policy a non-root user can change; check and replay only warn.

The loader's own rules are in test_loader.py; these tests check the wiring: the daemon's policy set (start
and reload both go through :func:`aithermd.runtime.world.load_policy_set`) is loaded strictly when it runs as root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aithermd.cli import main
from aithermd.errors import PolicyErrors
from aithermd.runtime.world import Engine, load_policy_set
from aithermd.settings import DaemonSettings

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "rtx4090-vlm-workload-padded-10min-idle.csv"
IS_ROOT = os.geteuid() == 0


def _policy_dir(tmp_path: Path, mode: int) -> tuple[Path, Path]:
    os.chmod(tmp_path, 0o755)
    d = tmp_path / "policies.d"
    d.mkdir(mode=0o755)
    f = d / "lab.yaml"
    f.write_text((ROOT / "policies" / "balanced.yaml").read_text())
    os.chmod(f, mode)
    return d, f


@pytest.mark.skipif(not IS_ROOT, reason="the daemon is strict only when it runs as root")
def test_the_daemon_as_root_refuses_a_world_writable_policy(tmp_path):
    d, f = _policy_dir(tmp_path, 0o666)
    settings = DaemonSettings(policy="lab", policy_dirs=[d], state_dir=tmp_path / "state")
    with pytest.raises(PolicyErrors) as info:
        load_policy_set(settings, Engine.default())
    assert [e.format() for e in info.value.errors] == [
        f"{f}: error: refusing a policy a non-root user can change: file {f} is writable by every user "
        f"(hint: chown root:root {f} {d} && chmod go-w {f} {d})"]
    os.chmod(f, 0o644)
    policies, dirs = load_policy_set(settings, Engine.default())
    assert set(policies) == {"lab"} and dirs == (d,)


def test_check_and_replay_only_warn(tmp_path, capsys):
    d, f = _policy_dir(tmp_path, 0o666)
    assert main(["check", str(f)]) == 0
    assert f"{f}: warning: file {f} is writable by every user" in capsys.readouterr().err
    assert main(["replay", "--trace", str(TRACE), "--policy", "lab", "--policy-dir", str(d), "--json"]) == 0
    out = capsys.readouterr()
    assert f"aithermd replay: warning: file {f} is writable by every user" in out.err
    assert '"decisions"' in out.out
