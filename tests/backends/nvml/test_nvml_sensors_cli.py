"""``aithermd sensors --gpu-profile DUMP``: fake GPUs from dumps, in the same JSON shape as every device."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.backends.nvml.conftest import DUMPS, H100, RTX4090

ROOT = Path(__file__).resolve().parents[3]
MACHINE = (
    ROOT / "tests" / "fixtures" / "sysfs" / "supermicro-as-4124gs-tnr-gpu-server-amd-energy-nvme-i350" / "sys"
)


def sensors(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aithermd", "sensors", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_gpu_profiles_join_the_recorded_machine():
    done = sensors(
        "--json",
        "--interval",
        "0",
        "--sysfs-root",
        str(MACHINE),
        "--gpu-profile",
        str(RTX4090),
        "--gpu-profile",
        str(H100),
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    gpus = [d for d in doc["devices"] if d["kind"] == "gpu"]
    assert doc["devices"][0]["kind"] == "hwmon", "the machine's own devices come first"
    assert [(g["id"], g["name"]) for g in gpus[:2]] == [
        ("gpu0", "NVIDIA GeForce RTX 4090"),
        ("gpu1", "NVIDIA GeForce RTX 4090"),
    ]
    assert len(gpus) == 9 and gpus[-1]["name"] == "NVIDIA H100 80GB HBM3", "8 RTX 4090 + 1 H100"
    g0 = gpus[0]
    assert set(g0) == {"id", "kind", "name", "channels", "knobs"}
    channels = {c["attribute"]: c for c in g0["channels"]}
    assert channels["temperature"] == {
        "id": "gpu0/temperature",
        "attribute": "temperature",
        "label": "temperature",
        "alias": None,
        "value": 28.0,
        "unit": "°C",
        "status": "ok",
        "reason": None,
    }
    assert channels["power"]["value"] == 20.0 and channels["fan0"]["unit"] == "%"
    knobs = {k["id"]: k for k in g0["knobs"]}
    assert knobs["gpu0/power_limit"] == {
        "id": "gpu0/power_limit",
        "kind": "power_limit",
        "value": 450.0,
        "unit": "W",
        "min": 150.0,
        "max": 450.0,
        "default": 450.0,
        "writable": True,
        "why_not": None,
    }
    assert knobs["gpu0/fan0"]["kind"] == "fan" and knobs["gpu0/fan0"]["max"] == 100.0
    h100 = {c["attribute"]: c["value"] for c in gpus[-1]["channels"]}
    assert h100["memory_temperature"] == 48.0 and "fan0" not in h100


def test_the_table_shows_gpus_and_a_bad_dump_is_a_clear_error(tmp_path):
    done = sensors(
        "--interval",
        "0",
        "--sysfs-root",
        str(MACHINE),
        "--gpu-profile",
        str(DUMPS / "rtx3090-x2-rtx3090ti-x2-nvidia-smi-q-d-power-clock.txt"),
    )
    assert done.returncode == 0, done.stderr
    assert "gpu3  (NVIDIA Graphics Device)" in done.stdout
    limits = [line for line in done.stdout.splitlines() if line.strip().startswith("power_limit:")]
    span = re.compile(r"100(\.0+)?–4[58]0(\.0+)? W\s+writable")
    assert len(limits) == 4 and all(span.search(line) for line in limits)
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    done = sensors("--json", "--interval", "0", "--sysfs-root", str(MACHINE), "--gpu-profile", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    assert f"{bad}: error: no GPU found" in done.stderr
