"""``aithermd sensors`` end to end: --sysfs-root on each recorded machine, the same machines under
umockdev-run with the default root, the table, and the JSON document's exact shape."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.helpers import (
    MACHINES,
    MACHINES_DIR,
    assert_agrees,
    assert_gpus_agree,
    document_view,
    lm_sensors_reference,
)

ROOT = Path(__file__).resolve().parents[2]
DEVICE_KEYS = {"id", "kind", "name", "channels", "knobs"}
CHANNEL_KEYS = {"id", "attribute", "label", "alias", "value", "unit", "status", "reason"}
KNOB_KEYS = {"id", "kind", "value", "unit", "min", "max", "default", "writable", "why_not"}
UMOCKDEV = shutil.which("umockdev-run")


def sensors(*args: str, prefix: tuple[str, ...] = (), cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "aithermd", "sensors", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def check_shape(doc: dict) -> None:
    assert set(doc) == {"devices"}
    for dev in doc["devices"]:
        expected = DEVICE_KEYS | ({"chip"} if dev["kind"] == "hwmon" else set())
        assert set(dev) == expected, dev["id"]
        assert dev["kind"] in ("hwmon", "powercap", "thermal", "cpu", "gpu")
        for ch in dev["channels"]:
            assert set(ch) == CHANNEL_KEYS
            assert ch["id"] == f"{dev['id']}/{ch['attribute']}"
            assert ch["status"] in ("ok", "held", "failed", "implausible", "not_supported", "stale")
            assert (ch["reason"] is None) == (ch["status"] == "ok")
            assert ch["value"] is None or isinstance(ch["value"], (int, float))
        for knob in dev["knobs"]:
            assert set(knob) == KNOB_KEYS
            assert knob["kind"] in ("pwm", "pl1", "pl2", "power_limit", "fan")


@pytest.mark.parametrize("machine", MACHINES)
def test_json_with_sysfs_root_agrees_with_lm_sensors(machine):
    result = sensors("--json", "--interval", "0", "--sysfs-root", str(MACHINES_DIR / machine / "sys"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # stdout is exactly one document
    check_shape(doc)
    # no live CPU mixed in; the AMD server's sockets are RAPL packages from its amd_energy counters; amdgpu
    # chips are GPUs
    kinds = {d["id"]: d["kind"] for d in doc["devices"]}
    assert {k for k, kind in kinds.items() if kind not in ("hwmon", "gpu")} == (
        {"powercap:package-0", "powercap:package-1"} if "amd-energy" in machine else set())
    assert_agrees(document_view(doc), assert_gpus_agree(doc, lm_sensors_reference(machine)))


@pytest.mark.skipif(UMOCKDEV is None, reason="umockdev-run is not installed")
@pytest.mark.parametrize("machine", MACHINES)
def test_json_under_umockdev_with_default_root_agrees_with_lm_sensors(machine):
    machine_dir = MACHINES_DIR / machine
    result = sensors(
        "--json", "--interval", "0", prefix=(UMOCKDEV, "-d", str(machine_dir / "machine.umockdev"), "--")
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    check_shape(doc)
    assert_agrees(document_view(doc), assert_gpus_agree(doc, lm_sensors_reference(machine)))


def test_table_is_grouped_by_device():
    machine = "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp"
    result = sensors("--interval", "0", "--sysfs-root", str(MACHINES_DIR / machine / "sys"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    heads = [line for line in lines if line and not line.startswith(" ")]
    assert heads == [
        "hwmon:k10temp-pci-00c3  (k10temp)",
        "hwmon:nct6798-isa-0290  (nct6798)",
        "gpu0  (AMD GPU (0000:07:00.0))",
    ]
    tctl = next(line for line in lines if line.strip().startswith("Tctl:"))
    assert "32.6 °C" in tctl and "temp1" in tctl
    assert any("pwm2" in line and "34.5 %" in line and "writable" in line for line in lines)


def test_missing_root_is_a_clear_error(tmp_path):
    result = sensors("--json", "--sysfs-root", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "not a directory" in result.stderr


@pytest.mark.parametrize(("interval", "status", "value"), [("0.05", "ok", 0.0), ("0", "stale", None)])
def test_rapl_power_needs_two_samples(tmp_path, interval, status, value):
    from aithermd.sim import ttar

    ttar.extract(ROOT / "tests" / "fixtures" / "ttar" / "node-exporter-sys-class-powercap-intel-rapl.ttar",
                 tmp_path)
    result = sensors("--json", "--interval", interval, "--sysfs-root", str(tmp_path / "sys"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    check_shape(doc)
    pkg = next(d for d in doc["devices"] if d["id"] == "powercap:package-0")
    power = next(c for c in pkg["channels"] if c["attribute"] == "power")
    assert (power["status"], power["value"]) == (status, value)  # the recorded counter does not move
    pl1 = next(k for k in pkg["knobs"] if k["kind"] == "pl1")
    assert (pl1["id"], pl1["value"], pl1["unit"], pl1["max"]) == ("powercap:package-0/pl1", 4090.0, "W", 95.0)


def test_json_stdout_holds_only_the_document_when_warnings_are_logged(capsys, monkeypatch):
    """A backend that fails to discover and one that fails to sample are logged as warnings: on stderr, never
    mixed into the one JSON document on stdout."""
    import argparse

    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.commands import sensors as command

    class Broken:
        kind = "broken"

        def __init__(self, fail_in: str) -> None:
            self.fail_in = fail_in

        def discover(self):
            if self.fail_in == "discover":
                raise RuntimeError("discover exploded")
            return []

        def sample(self):
            raise RuntimeError("sample exploded")

        def close(self) -> None:
            pass

    machine = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
    monkeypatch.setattr(
        command, "open_for", lambda args: [Broken("discover"), HwmonBackend(str(machine)), Broken("sample")]
    )
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--json", "--interval", "0", "--sysfs-root", str(machine)])) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # the whole of stdout is one document
    check_shape(doc)
    assert [d["id"] for d in doc["devices"]][0] == "hwmon:k10temp-pci-00c3"
    assert "discover exploded" in err and "sample exploded" in err
    assert "exploded" not in out
