"""The README's first command on a fresh machine: what scripts/simulate asks of the machine and says when
something is missing. The scripts run in a copy of the repository with stand-ins for python3, pip, apt-get,
dpkg-query and id on PATH, which record how they were called. The real fresh-machine run (a debootstrap'd
Debian with only python3 and git) is packaging/check's `fresh` stage."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _ship import ROOT


def _exe(path: Path, text: str) -> None:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fresh(tmp_path: Path):
    """A copy of the scripts and pyproject.toml, and a bin/ of stand-ins. ``calls`` logs every call."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    calls.write_text("")
    # python3 whose venv module works only once $VENV_OK exists (python3-venv "installed")
    _exe(bin_ / "python3", f"""
echo "python3 $*" >>{calls}
case "$1" in
  -c) exec {sys.executable} "$@" ;;
  -m) [ -e {tmp_path}/venv-ok ] || {{ echo "ensurepip is not available" >&2; exit 1; }}
      mkdir -p "$3/bin"
      printf '#!/bin/bash\\necho "pip $*" >>{calls}\\n' >"$3/bin/pip"; chmod +x "$3/bin/pip"
      ln -sf {bin_}/python3 "$3/bin/python" ;;
esac
""")
    _exe(bin_ / "dpkg-query", "exit 1\n")  # nothing installed
    _exe(bin_ / "apt-get",
         f'echo "apt-get $*" >>{calls}\ncase "$*" in *install*) touch {tmp_path}/venv-ok;; esac\n')
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return repo, bin_, calls, env


def _run(repo: Path, script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(repo / script), *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_main_job_installs_no_test_tools(fresh):
    repo, _, calls, env = fresh
    (repo.parent / "venv-ok").touch()
    result = _run(repo, "scripts/bootstrap", env)
    assert result.returncode == 0, result.stderr
    pip = [line for line in calls.read_text().splitlines() if line.startswith("pip ")]
    assert pip[-1].endswith("-e .[tui]"), pip  # not [tui,dev]: python-dbusmock builds dbus-python (meson)
    assert "installing aithermd[tui]" in result.stderr
    result = _run(repo, "scripts/bootstrap", env, "dev")  # the test command adds the test tools
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines()[-1].endswith("-e .[tui,dev]")
    calls.write_text("")
    assert _run(repo, "scripts/bootstrap", env).returncode == 0  # dev includes what simulate needs
    assert "pip" not in calls.read_text()


def test_a_missing_venv_module_is_named_in_one_line_without_root(fresh):
    repo, bin_, calls, env = fresh
    _exe(bin_ / "id", 'echo 1000\n')
    result = _run(repo, "scripts/bootstrap", {**env, "AITHERMD_BOOTSTRAP_CALLER": "scripts/simulate"})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "scripts/simulate: missing Debian packages (install them as root: apt-get install python3-venv "
        f"python3.{sys.version_info[1]}-venv)"]
    assert "apt-get" not in calls.read_text() and not (repo / ".venv").exists()


def test_as_root_the_venv_module_is_installed_waiting_for_the_apt_lock(fresh):
    repo, bin_, calls, env = fresh
    _exe(bin_ / "id", 'echo 0\n')
    result = _run(repo, "scripts/bootstrap", env)
    assert result.returncode == 0, result.stderr
    apt = [line for line in calls.read_text().splitlines() if line.startswith("apt-get ")]
    assert len(apt) == 2 and "update" in apt[0] and "install" in apt[1] and "python3-venv" in apt[1]
    assert all("DPkg::Lock::Timeout=600" in line for line in apt), apt  # unattended-upgrades holds it
    assert (repo / ".venv/bin/pip").exists()


def test_install_system_deps_waits_for_the_lock(fresh):
    repo, bin_, calls, env = fresh
    _exe(bin_ / "id", 'echo 0\n')
    result = _run(repo, "scripts/install-system-deps", {**env, "APT_LOCK_TIMEOUT_S": "42"})
    assert result.returncode == 0, result.stderr
    apt = [line for line in calls.read_text().splitlines() if line.startswith("apt-get ")]
    assert apt and all("DPkg::Lock::Timeout=42" in line for line in apt), apt
    assert "umockdev" in apt[-1]
