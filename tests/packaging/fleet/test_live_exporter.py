"""The dashboard and the alert rules against a real scrape: the simulated workstation (`aithermd run
--simulate`) serves /metrics, and every label a query selects, groups by or shows in a legend exists on the
metrics that query reads (the static checks only see metric names)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import FLEET, dashboard_module
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus at scrape time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scrape() -> Iterator[dict[str, set[str]]]:
    """{series name: label names seen} from one scrape of the simulated daemon, once GPUs report."""
    port = free_port()
    aithermd = Path(sys.executable).parent / "aithermd"
    proc = subprocess.Popen([str(aithermd), "run", "--simulate", "--bus", "none", "--metrics-listen",
                             f"127.0.0.1:{port}", "--speedup", "5", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline and "aithermd_gpu_power_watts{" not in text:
            assert proc.poll() is None, "the simulated daemon exited"
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
            time.sleep(0.3)
        assert "aithermd_gpu_power_watts{" in text, "no GPU metrics within 60 s"
        series: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
        yield series
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def label_uses(expr: str, legend: str = "") -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL query (and its legend) relies on."""
    metrics = set(re.findall(r"\b(aithermd_[a-z0-9_]+)", expr))
    labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    labels |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    labels |= set(re.findall(r"\$labels\.(\w+)", legend))
    return metrics, labels - SCRAPE_LABELS - {"le", "__name__"}


def check_labels(where: str, expr: str, legend: str, series: dict[str, set[str]]) -> list[str]:
    metrics, labels = label_uses(expr, legend)
    present = [m for m in metrics if m in series]
    if not present:
        return []  # event-only series (drift, faults, holds) may be absent from a quiet run
    have = set().union(*(series[m] for m in present))
    return [f"{where}: label {lbl!r} is on none of {sorted(present)}" for lbl in sorted(labels - have)]


def test_core_series_are_exported(scrape: dict[str, set[str]]) -> None:
    for name in ("aithermd_gpu_temperature_celsius", "aithermd_gpu_power_watts",
                 "aithermd_gpu_power_limit_watts", "aithermd_gpu_energy_joules_total",
                 "aithermd_gpu_clock_event_reason", "aithermd_policy_active",
                 "aithermd_build_info", "aithermd_tick_duration_seconds_bucket",
                 "aithermd_snapshot_timestamp_seconds", "aithermd_failsafe_active"):
        assert name in scrape, name
    assert {"gpu_index", "gpu_uuid", "gpu_name"} <= scrape["aithermd_gpu_power_watts"]


def test_dashboard_labels_exist(scrape: dict[str, set[str]]) -> None:
    doc = dashboard_module().build()
    problems = []
    for panel in doc["panels"]:
        for t in panel.get("targets", []):
            problems += check_labels(f"{panel['title']} {t['refId']}", t["expr"], t["legendFormat"], scrape)
    assert problems == []


def test_alert_labels_exist(scrape: dict[str, set[str]]) -> None:
    text = (FLEET / "prometheus" / "aithermd-alerts.yml").read_text()
    problems = []
    for block in text.split("- alert: ")[1:]:
        name = block.split("\n", 1)[0]
        expr = block.split("expr:", 1)[1].split("labels:", 1)[0]
        annotations = block.split("annotations:", 1)[1]
        problems += check_labels(name, expr, annotations, scrape)
    assert problems == []


def test_label_check_can_fail(scrape: dict[str, set[str]]) -> None:
    assert check_labels("x", 'max by (slot) (aithermd_gpu_power_watts{card="0"})', "{{board}}", scrape) == [
        "x: label 'board' is on none of ['aithermd_gpu_power_watts']",
        "x: label 'card' is on none of ['aithermd_gpu_power_watts']",
        "x: label 'slot' is on none of ['aithermd_gpu_power_watts']"]
