"""attack7 H7: after a torn journal only the fans were made safe. A GPU power limit a crashed daemon had cut
(a critical temperature → its minimum) stayed cut, the next daemon journaled the cut as the "original" and
every stop put it back. Now a GPU limit found below the device's default (NVML's default limit) goes to the
default, a clock lock is reset, with one warning each; a limit at or above the default is left alone."""

from __future__ import annotations

import sys

import pytest
import structlog

from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.actuate.restore import restore_at_start
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.registry import discover
from aithermd.cli import main
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import H100, RTX4090, profile
from tests.support.machines import copy_machine


def _cut(fake: FakeNvml, index: int, watts: int) -> None:
    nv = fake.bindings()
    nv.nvmlInit()
    nv.nvmlDeviceSetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(index), watts * 1000)
    nv.nvmlShutdown()


def _limit_w(fake: FakeNvml, index: int) -> float:
    nv = fake.bindings()
    nv.nvmlInit()
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(index)) / 1000
    finally:
        nv.nvmlShutdown()


@pytest.fixture
def backend_over():
    made: list[NvmlBackend] = []
    yield lambda fake: made.append(NvmlBackend(nvml=fake.bindings())) or made[-1]
    for backend in made:
        backend.close()


@pytest.fixture
def torn(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / JOURNAL_FILE).write_text('{"entries": [{"knob_id": "gpu0/power_l')
    return state


def test_start_after_a_torn_journal_puts_a_cut_gpu_limit_back_to_its_default(torn, backend_over):
    fake = FakeNvml([profile(RTX4090), profile(H100)], fan_count=[1, None], driver_version="590.48.01")
    _cut(fake, 0, 150)  # the crashed daemon's critical cut: the RTX 4090's minimum
    backend = backend_over(fake)
    inventory = discover([backend])
    default = inventory.knobs["gpu0/power_limit"].default
    h100 = _limit_w(fake, 1)
    journal = Journal(torn, quarantine=True)
    assert journal.lost is not None
    with structlog.testing.capture_logs() as logs:
        restore_at_start(journal, inventory.owner, inventory.knobs.values(), inventory.backends, False)
    assert default == 450.0 and _limit_w(fake, 0) == 450.0
    assert _limit_w(fake, 1) == h100  # at its default already: untouched
    said = [e["message"] for e in logs if e["event"] == "made_safe" and e["knob"] == "gpu0/power_limit"]
    assert len(said) == 1 and "found at 150 W, below the device's default limit 450 W" in said[0]
    assert not [e for e in logs if e["event"] == "made_safe" and e["knob"] == "gpu1/power_limit"]


def test_a_dry_run_start_writes_nothing(torn, backend_over):
    fake = FakeNvml([profile(RTX4090)], fan_count=[1])
    _cut(fake, 0, 150)
    backend = backend_over(fake)
    inventory = discover([backend])
    restore_at_start(Journal(torn, quarantine=True), inventory.owner, inventory.knobs.values(),
                     inventory.backends, True)
    assert _limit_w(fake, 0) == 150.0


def test_aithermd_restore_on_a_torn_journal_resets_the_gpu_limit_and_clock_lock(torn, tmp_path, monkeypatch,
                                                                                capsys):
    root = copy_machine(tmp_path)
    fake = FakeNvml([profile(RTX4090)], fan_count=[1])
    _cut(fake, 0, 150)
    nv = fake.bindings()
    monkeypatch.setitem(sys.modules, "pynvml", nv)  # what open_for_daemon imports when it is loaded
    nv.nvmlInit()
    nv.nvmlDeviceSetGpuLockedClocks(nv.nvmlDeviceGetHandleByIndex(0), 210, 1200)  # the crash's lock
    nv.nvmlShutdown()
    assert fake.gpus[0].locked_clocks == (210, 1200)
    assert main(["restore", "--state-dir", str(torn), "--sysfs-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert _limit_w(fake, 0) == 450.0 and fake.gpus[0].locked_clocks is None
    assert "aithermd restore: warning: gpu0/power_limit: found at 150 W, below the device's default" in err
    assert "aithermd restore: warning: gpu0/sm_clock_lock: its original is lost with the journal" in err
