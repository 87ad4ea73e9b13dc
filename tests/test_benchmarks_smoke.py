"""The whole-process benchmark runs in CI as a smoke: seconds of every peer on the reference scenario, checked
to tick, control its fans and serve /metrics; no figure is judged here (benchmarks/bench_process.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_bench_process_smoke(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_process.py"), "--smoke",
                           "--json", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for goal in ("reference tick CPU", "reference tick / lean loop", "marginal per hwmon channel",
                 "marginal per simulated GPU", "RSS steady", "/metrics p50", "start-up CPU to first tick (first start)",
                 "start-up CPU to first tick (restart)",
                 "aithermctl --help wall", "aithermctl status wall", "fan2go not measured"):
        assert goal in proc.stdout, proc.stdout
    import json
    doc = json.loads(out.read_text())
    ref = doc["scenarios"]["reference"]
    assert set(ref) == {"after", "lean"}
    for kind in ("after", "lean"):
        assert ref[kind]["rss_mb"] > 5 and ref[kind]["metrics_p50_ms"] > 0
    assert doc["startup"]["after"]["cpu_s"] > 0 and doc["startup"]["after restart"]["cpu_s"] > 0


@pytest.mark.timeout(300)
def test_bench_efficiency_smoke(tmp_path):
    """The efficiency benchmark end to end on 2 short jobs per class: every row of the table is printed and
    written, each against its stock twin; the best static setting keeps its budget; held-high idle is
    found on both cards. The goals' figures are the full run's (CALIBRATION.md), not judged here."""
    import json

    out = tmp_path / "efficiency.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_efficiency.py"), "--smoke",
                           "--json", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["jobs"] == 2 and set(doc["classes"]) == {
        "consumer Ada/Ampere training", "A100/H100-class training", "memory-bound decode (locked clocks)"}
    training = doc["classes"]["consumer Ada/Ampere training"]
    assert set(training) == {"stock", "fixed 70 %", "best static (3 %)", "best static (5 %)",
                             "oracle at edge (3 %)", "oracle at edge (5 %)", "search exact (3 %)",
                             "search exact (5 %)", "search proxy (3 %)"}
    assert training["stock"] == {"gain_pct": 0.0, "slowdown_pct": 0.0, "p95_slowdown_pct": 0.0}
    assert training["fixed 70 %"]["gain_pct"] > 5.0 and training["fixed 70 %"]["slowdown_pct"] > 1.0
    for budget in (3, 5):
        assert 0.0 < training[f"best static ({budget} %)"]["p95_slowdown_pct"] <= budget
        assert training[f"best static ({budget} %)"]["gain_pct"] > 0.0
        # the oracle at the budget's edge: never under the grid's best, never over the budget
        edge = training[f"oracle at edge ({budget} %)"]
        assert edge["gain_pct"] >= training[f"best static ({budget} %)"]["gain_pct"] - 1e-9
        assert 0.0 < edge["p95_slowdown_pct"] <= budget + 1e-9
    assert training["search exact (3 %)"]["gain_pct"] > 0.0
    decode = doc["classes"]["memory-bound decode (locked clocks)"]
    assert decode["fixed 70 %"]["gain_pct"] == pytest.approx(0.0, abs=0.5)  # no cap binds decode
    assert decode["best static (2 %)"]["gain_pct"] > 10.0
    assert decode["oracle at edge (2 %)"]["gain_pct"] >= decode["best static (2 %)"]["gain_pct"] - 1e-9
    assert doc["held_idle"]["found"] == doc["held_idle"]["cases"] == 2
    assert doc["held_idle"]["median_recovered_w"] > 0.0
    assert set(doc["quality"]) == {"rtx4090-vlm-workload-padded-10min-idle.csv",
                                   "windows-training-padded-10min-idle.csv"}
    for name, goals in doc["goals"].items():
        for row, met in goals.items():
            assert f"goal {row}" in proc.stdout and isinstance(met, bool), (name, row)
    assert "CPU-minutes" in proc.stdout
