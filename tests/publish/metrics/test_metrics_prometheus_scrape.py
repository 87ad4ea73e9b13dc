"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes the exporter on loopback; the value comes back
through its HTTP query API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_prometheus_scrapes_and_answers_a_query(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (scripts/system-packages.txt: prometheus)")
    hub = StateHub()
    hub.publish(reference_snapshot(1))
    exporter = metrics.start("127.0.0.1:0", hub)
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: aithermd\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.address[1]}']\n")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))
    try:
        query = urllib.parse.quote('aithermd_gpu_power_limit_watts{gpu_index="1"}')
        hub.publish(reference_snapshot(2))
        deadline = time.monotonic() + 60
        result: list = []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                answer = _get(f"http://127.0.0.1:{web}/api/v1/query?query={query}")
            except OSError:
                continue  # not listening yet
            result = answer["data"]["result"]
        assert result, (tmp_path / "prometheus.log").read_text()
        (series,) = result
        assert series["metric"]["job"] == "aithermd"
        assert series["metric"]["gpu_uuid"] == "GPU-1a2b3c4d-0000-4000-8000-000000000001"
        assert float(series["value"][1]) == 450.0
        targets = _get(f"http://127.0.0.1:{web}/api/v1/targets")["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        exporter.stop()
