"""attack13 A1: an amdgpu fan whose ``pwm1`` reads back the fan controller's ramping output (SMU11
``FDO_PWM_DUTY``, SMU13 ``CurrFanPwm``) was taken for another program rewriting it: false drift, ``conflict``,
the fan handed back to the driver for 10 min. The GPU hwmon backend had no ``pwm_knob``, so the applier never
saw that the read-back trails the writes. Here the real daemon (real engine, a step policy) runs over the
recorded RX 7900 XTX tree behind a driver that answers as amdgpu does, on the simulated clock."""

from __future__ import annotations

import os

import pytest

from aithermd.backends.gpu_hwmon import HwmonGpuBackend
from aithermd.backends.sysfs import SysfsIO
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.backends.test_gpu_hwmon import tree

STEP = """\
description: the GPU fan curve without smoothing or ramp limits (a step follows the temperature at once)
curves:
  gpu:
    kind: points
    source: {max: [{same_gpu: temperature}]}
    points: [[40, 30], [55, 35], [65, 50], [75, 75], [82, 100]]
rules:
  - name: gpu-fans
    kind: fan
    fans: {id: "gpu*/fan*"}
    curve: gpu
"""
RAMP_RAW_S = 15.0  # what the attack's fake driver ramps at: about 6 %/s
FULL_RPM = 3300.0


class AmdgpuFanIO(SysfsIO):
    """amdgpu's fan as its driver answers: a ``pwm1`` write is refused (EINVAL) unless ``pwm1_enable`` is 1
    ("manual fan speed control should be enabled first"); a ``pwm1`` read reports the fan controller's output,
    ramping toward the value written at ``RAMP_RAW_S`` raw units per second of ``clock``; ``fan1_input``
    follows that output."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.paths: dict[int, str] = {}
        self.start = self.target = 0.0  # raw pwm
        self.since = clock.monotonic()

    def output(self) -> int:
        moved = RAMP_RAW_S * (self.clock.monotonic() - self.since)
        step = self.target - self.start
        return round(self.target if abs(step) <= moved else self.start + moved * (1 if step > 0 else -1))

    def open(self, path: str) -> int:
        fd = super().open(path)
        self.paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        self.paths.pop(fd, None)
        super().close(fd)

    def pread(self, fd: int, size: int) -> bytes:
        path = self.paths.get(fd, "")
        if path.endswith("/pwm1"):
            return f"{self.output()}\n".encode()
        if path.endswith("/fan1_input"):
            return f"{round(FULL_RPM * self.output() / 255)}\n".encode()
        return super().pread(fd, size)

    def write(self, path: str, data: bytes) -> None:
        if path.endswith("/pwm1"):
            with open(os.path.join(os.path.dirname(path), "pwm1_enable")) as f:
                if f.read().strip() != "1":
                    raise OSError(22, "Invalid argument", path)
            self.start, self.target, self.since = float(self.output()), float(data), self.clock.monotonic()
        super().write(path, data)


@pytest.fixture
def card(tmp_path, clock):
    root = tree(tmp_path, "rx7900xtx")
    hw = next((root / "class" / "hwmon").iterdir()).resolve()
    (hw / "temp1_input").write_text("39000\n")  # the curve's 30 %
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "step.yaml").write_text(STEP)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False, policy="step", policy_pinned=True,
                              policy_dirs=[policies])
    io = AmdgpuFanIO(clock)
    daemon = Daemon(settings, clock=clock, backends=[HwmonGpuBackend(str(root), io=io)], sleep=clock.sleep)
    return daemon, hw, io


async def test_an_amdgpu_fan_ramping_to_a_step_is_no_drift_and_no_conflict(card):
    """39 → 70 °C: the curve steps 30 → 62.5 %, the read-back climbs there over seconds. Each move is the
    driver settling on what was asked: no "changed behind our back", no conflict, the fan stays the daemon's
    and reaches 62.5 %."""
    d, hw, io = card
    seen = []

    def step() -> bool:
        snap = d.hub.latest
        if snap.seq == 5:
            (hw / "temp1_input").write_text("70000\n")  # curve: 62.5 %
        seen.append((snap.seq, io.output(), (hw / "pwm1_enable").read_text().strip()))
        return False

    assert await d.run(max_ticks=25, until=step) == 0
    events = [e for e in d.hub.recent_events() if e.subject == "gpu0/fan0"]
    assert [e.message for e in events if e.kind != "actuation"] == []  # no drift, no conflict, no restore
    assert [e.data["new"] for e in events][-1] == 62.5
    assert all(mode == "1" for _, _, mode in seen)  # the daemon's (manual) throughout, never handed back
    outputs = [out for _, out, _ in seen]
    assert outputs == sorted(outputs) and outputs[-1] == 160  # climbed to 62.5 % (raw 160) and stayed
    assert (hw / "pwm1_enable").read_text().strip() == "2"  # handed back at the stop as found


async def test_an_amdgpu_fan_ramping_is_learnt_lagging_and_not_said_stuck_at_every_step(card):
    """The read-back taken just after a write trails it: once learnt (``Levels.lagging``), a write is not said
    "did not stick" each time the curve moves."""
    d, hw, io = card
    temps = iter([45, 50, 58, 62, 66, 70, 74, 78])

    def step() -> bool:
        if d.hub.latest.seq >= 4 and d.hub.latest.seq % 3 == 0:
            t = next(temps, None)
            if t is not None:
                (hw / "temp1_input").write_text(f"{t}000\n")
        return False

    assert await d.run(max_ticks=30, until=step) == 0
    events = [e for e in d.hub.recent_events() if e.subject == "gpu0/fan0"]
    assert "conflict" not in [e.kind for e in events]
    assert len([e for e in events if e.kind == "drift"]) <= 1
