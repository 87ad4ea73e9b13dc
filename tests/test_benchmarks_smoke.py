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
                 "marginal per simulated GPU", "RSS steady", "/metrics p50", "start-up CPU to first tick",
                 "aithermctl --help wall", "aithermctl status wall", "fan2go not measured"):
        assert goal in proc.stdout, proc.stdout
    import json
    doc = json.loads(out.read_text())
    ref = doc["scenarios"]["reference"]
    assert set(ref) == {"after", "lean"}
    for kind in ("after", "lean"):
        assert ref[kind]["rss_mb"] > 5 and ref[kind]["metrics_p50_ms"] > 0
    assert doc["startup"]["after"]["cpu_s"] > 0
