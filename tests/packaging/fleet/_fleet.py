"""Helpers shared by the fleet tests: paths, tools, and the metric names the exporter can produce."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
FLEET = ROOT / "packaging" / "fleet"
METRICS_SOURCE = ROOT / "aithermd" / "publish" / "metrics.py"
METRICS_SOURCES = sorted((ROOT / "aithermd" / "publish").glob("*metrics.py"))  # every exporter family


def need_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (see scripts/system-packages.txt)")
    return found


def dashboard_module() -> ModuleType:
    """packaging/fleet/grafana/dashboard.py, imported from its path (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("aithermd_dashboard", FLEET / "grafana" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exported_metrics() -> set[str]:
    module = dashboard_module()
    return set().union(*(module.exported_metrics(source) for source in METRICS_SOURCES))
