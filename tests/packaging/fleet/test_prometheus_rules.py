"""packaging/fleet/prometheus: the alert rules pass promtool's check and their unit tests, and name only
metrics the exporter produces; the example configuration is a valid Prometheus configuration."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from _fleet import FLEET, exported_metrics, need_tool

PROM = FLEET / "prometheus"
RULES = PROM / "aithermd-alerts.yml"
REQUIRED_ALERTS = {  # issue 11: GPU throttling, drift, failsafe active, daemon down, exporter absent
    "AithermdGpuThermalThrottling", "AithermdKnobDrift", "AithermdFailsafeActive", "AithermdDaemonDown",
    "AithermdExporterAbsent"}


def promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_tool("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 18 rules found" in done.stdout


def test_promtool_test_rules() -> None:
    done = promtool("test", "rules", "aithermd-alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_unit_tests_catch_a_changed_rule(tmp_path: Path) -> None:
    # Loosen one rule's threshold: the unit tests must notice.
    shutil.copy(PROM / "aithermd-alerts.test.yml", tmp_path)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("increase(aithermd_drift_total[15m]) > 2",
                                                                 "increase(aithermd_drift_total[15m]) > 0"))
    done = promtool("test", "rules", "aithermd-alerts.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "AithermdKnobDrift" in done.stdout + done.stderr


def test_required_alerts_exist_and_each_is_unit_tested() -> None:
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
    assert REQUIRED_ALERTS <= alerts
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "aithermd-alerts.test.yml").read_text()))
    assert alerts == tested


def test_rules_name_only_exported_metrics() -> None:
    used = set(re.findall(r"\b(aithermd_[a-z0-9_]+)", RULES.read_text()))
    assert used and used - exported_metrics() == set()


def test_example_config_is_valid(tmp_path: Path) -> None:
    shutil.copy(PROM / "prometheus.example.yml", tmp_path / "prometheus.yml")
    shutil.copy(RULES, tmp_path)
    done = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
