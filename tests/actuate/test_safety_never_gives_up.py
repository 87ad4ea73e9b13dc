"""The report that opened issue 15: another program keeps writing the CPU fan's pwm to 0; the daemon steps
back (policy decisions); then the CPU runs hot, or its sensor fails. Safety never steps back: full duty is
written every tick it does not hold, and the fight is reported (event, alarm, metric, explain). The whole
daemon, the real engine and shipped policy, on the recorded X570 board."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.publish.metrics import MetricsHandle, render
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.machines import copy_machine
from tests.support.proc import knob_files

NCT = "devices/platform/nct6775.656/hwmon/hwmon1"
K10 = "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2"
PWM2 = "hwmon:nct6798-isa-0290/pwm2"


@pytest.fixture
def machine(tmp_path):
    root = copy_machine(tmp_path)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False)
    return root, settings, knob_files(root)


@pytest.mark.parametrize("trouble", ["critical", "failed-sensor"])
async def test_a_safety_decision_is_written_over_a_program_that_keeps_writing_zero(machine, clock, trouble):
    root, settings, original = machine
    tctl = root / K10 / "temp1_input"
    if trouble == "critical":  # a k10temp that states its limit (Family 15h does; Zen chips state none)
        (root / K10 / "temp1_crit").write_text("100000\n")
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep)
    metrics = MetricsHandle(d.hub)
    pwm2 = root / NCT / "pwm2"
    after: list[str] = []

    def other_program(t):  # fancontrol with a pump curve gone wrong: pwm2 := 0 before every sample
        if d.hub.latest is not None:
            pwm2.write_text("0\n")
            if d.hub.latest.seq >= 6:  # stepped back by now; then the CPU's trouble begins
                tctl.write_text("97000\n" if trouble == "critical" else "-128000\n")

    d.before_sample = other_program
    await d.run(max_ticks=12, until=lambda: after.append(pwm2.read_text()) and False)
    events = d.hub.recent_events()
    conflicts = [e for e in events if e.kind == "conflict" and e.subject == PWM2]
    assert "stepping back" in conflicts[0].message
    assert "written over the program that keeps rewriting it" in conflicts[1].message  # said once
    assert len(conflicts) == 2
    rule = "safety/critical-temperature" if trouble == "critical" else "safety/failed-source"
    writes = [e for e in events if e.kind == "actuation" and e.subject == PWM2 and e.data["rule"] == rule]
    assert len(writes) >= 3  # every tick the other program wrote 0 again
    assert after[-3:] == ["255\n"] * 3  # what the tick left in place, each tick
    snap = d.hub.latest
    assert snap.decisions[PWM2].rule == rule and snap.alarms[PWM2].kind == "conflict"
    explained = d.control.explain(PWM2)[PWM2]
    assert explained["rule"] == rule and explained["alarms"][PWM2]["kind"] == "conflict"
    text = render(metrics).decode()
    assert f'aithermd_knob_conflict{{knob="{PWM2}"}} 1.0' in text
    assert 'aithermd_knob_conflict{knob="hwmon:nct6798-isa-0290/pwm1"} 0.0' in text
    metrics.stop()
    assert knob_files(root) == {**original}  # and everything is put back at the end
