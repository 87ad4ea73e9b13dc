"""The admin's names for fans and sensors (config ``names``): shown in status, explain and metrics (``label``)
and matched by policies; the ids stay the stable ones, and the driver's own label still matches."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.fans.store import FanSetup, apply
from aithermd.model import FanCalibration
from aithermd.policy.selectors import select_temperatures
from aithermd.publish.metrics import MetricsHandle, render
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.machines import copy_machine, machine_root

NCT = "hwmon:nct6798-isa-0290"
TCTL = "hwmon:k10temp-pci-00c3/temp1"
NAMES = {f"{NCT}/pwm2": "CPU fan", TCTL: "CPU", f"{NCT}/fan3": "front intake"}


def devices():
    backend = HwmonBackend(str(machine_root()))
    try:
        return tuple(backend.discover())
    finally:
        backend.close()


def test_names_label_knobs_and_channels_and_the_old_label_still_matches():
    setup = FanSetup({f"{NCT}/pwm2": FanCalibration(tachs=(f"{NCT}/fan2", f"{NCT}/fan5"))})
    named = {d.id: d for d in apply(devices(), setup, NAMES)}
    nct = {c.id: c for c in named[NCT].channels}
    knobs = {k.id: k for k in named[NCT].knobs}
    assert knobs[f"{NCT}/pwm2"].label == "CPU fan" and knobs[f"{NCT}/pwm2"].id == f"{NCT}/pwm2"
    assert (nct[f"{NCT}/fan2"].label, nct[f"{NCT}/fan5"].label) == ("CPU fan", "CPU fan (2)")  # its fans
    assert nct[f"{NCT}/fan3"].label == "front intake"
    tctl = next(c for c in named["hwmon:k10temp-pci-00c3"].channels if c.id == TCTL)
    assert (tctl.label, tctl.alias) == ("CPU", "Tctl")
    assert [c.id for c in select_temperatures(["cpu"], tuple(named.values()))] == [TCTL]
    assert TCTL in [c.id for c in select_temperatures(["Tctl"], tuple(named.values()))]  # shipped policies


@pytest.mark.parametrize("bad", [{"pwm2": "x"}, {f"{NCT}/pwm2": ""}, {f"{NCT}/pwm2": "a\nb"}])
def test_a_bad_name_is_a_config_error(bad):
    with pytest.raises(Exception) as info:
        DaemonSettings(names=bad)
    assert "names" in str(info.value)


POLICY = """description: names
curves:
  cpu: {kind: points, source: CPU, points: [[30, 40], [80, 100]]}
rules:
  - {name: cpu-fan, kind: fan, fans: {label: CPU fan}, curve: cpu}
"""


async def test_the_daemon_shows_the_names_and_policies_use_them(tmp_path, clock):
    root = copy_machine(tmp_path)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "names.yaml").write_text(POLICY)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False, policy="names", policy_pinned=True,
                              policy_dirs=[tmp_path / "policies"], names=NAMES)
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep)
    metrics = MetricsHandle(d.hub)
    await d.run(max_ticks=3)
    snap = d.hub.latest
    assert set(snap.decisions) == {f"{NCT}/pwm2"}  # the rule found its fan by the admin's name
    assert snap.decisions[f"{NCT}/pwm2"].inputs["used:cpu"] == TCTL  # and its sensor
    assert d.control.explain(f"{NCT}/pwm2")[f"{NCT}/pwm2"]["label"] == "CPU fan"
    text = render(metrics).decode()
    assert 'aithermd_fan_speed_rpm{chip="nct6798-isa-0290",label="front intake",' \
           'node_chip="platform_nct6775_656",sensor="fan3"}' in text
    assert f'aithermd_fan_duty_ratio{{chip="nct6798-isa-0290",knob="{NCT}/pwm2",label="CPU fan",' \
           'node_chip="platform_nct6775_656",sensor="fan2"}' in text
    metrics.stop()
