"""Helpers shared by the packaging tests: repository paths and the installed entry points of this venv."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
PACKAGING = ROOT / "packaging"


def venv_script(name: str) -> Path:
    """Absolute path of a console script installed next to the running interpreter (the test venv)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed in this environment")
    return Path(found).absolute()


def need_tool(name: str) -> str:
    """The path of a system tool; the test is skipped when it is missing (see scripts/system-packages.txt)."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (see scripts/system-packages.txt)")
    return found


need_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")
