"""The fake NVML's state file: a second instance or process (``aithermd restore``) sees the same GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aithermd.backends.nvml import open_from_locator
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import H100, RTX4090, profile

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def shared(tmp_path):
    return FakeNvml([profile(RTX4090), profile(H100)], state_path=tmp_path / "nvml.json", fan_count=[1, 0])


def test_a_second_instance_sees_the_same_gpus_and_limits(shared, backend_over):
    daemon = backend_over(shared)
    originals = {k: daemon.save_knob(k) for k in ("gpu0/power_limit", "gpu0/fan0")}
    daemon.write_knob("gpu0/power_limit", 275)
    daemon.write_knob("gpu0/fan0", 85)
    other = FakeNvml.open(shared.state_path)
    assert [g.uuid for g in other.gpus] == [g.uuid for g in shared.gpus]
    assert [g.bus_id for g in other.gpus] == ["00000000:01:00.0", "00000000:00:09.0"]
    assert (other.power_limit_w(0), other.fan_auto(0, 0), other.fan_target_pct(0, 0)) == (275.0, False, 85)
    restorer = backend_over(other)
    for knob_id, saved in originals.items():
        restorer.restore_knob(knob_id, saved)
    assert (shared.power_limit_w(0), shared.fan_auto(0, 0)) == (450.0, True), "the first instance sees it"
    assert daemon.read_knob("gpu0/power_limit").value == 450.0


def test_lost_gpus_and_privilege_travel_too(shared):
    shared.lose_gpu(1)
    shared.privileged = False
    other = FakeNvml.open(shared.state_path)
    nv = other.bindings()
    nv.nvmlInit()
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(1))
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceSetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(0), 300000)


def test_restore_in_another_process(shared, backend_over):
    daemon = backend_over(shared)
    saved = daemon.save_knob("gpu1/power_limit")
    daemon.write_knob("gpu1/power_limit", 400)
    script = (
        "import json, sys\n"
        "from aithermd.backends.nvml import open_from_locator\n"
        "b = open_from_locator(json.loads(sys.argv[1]))\n"
        "b.discover()\n"
        "print(b.read_knob('gpu1/power_limit').value)\n"
        "b.restore_knob('gpu1/power_limit', json.loads(sys.argv[2]))\n"
        "b.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(daemon.locator()), json.dumps(saved)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "400.0", "the other process saw the daemon's limit"
    assert shared.power_limit_w(1) == 700.0 and daemon.read_knob("gpu1/power_limit").value == 700.0


def test_dynamic_values_are_written_on_save(shared):
    shared.set_dynamic(1, temp_c=66, power_draw_w=500)
    shared.save()
    other = FakeNvml.open(shared.state_path)
    assert (other.gpus[1].temp_c, other.gpus[1].power_mw) == (66, 500000)


def test_a_bad_state_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"gpus": []}')
    with pytest.raises(ValueError, match="not a fake NVML state file"):
        FakeNvml.open(bad)
    with pytest.raises(OSError):
        open_from_locator({"backend": "nvml", "fake_state": str(tmp_path / "missing.json")})
