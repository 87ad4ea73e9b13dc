"""Selectors through the engine: RAPL zones by name or id, fans by id pattern, temperature sources by id or
label, and curve sources combined as min / mean / max."""

from __future__ import annotations

import textwrap

import pytest

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, Quantity
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from tests.policy.machines import K10, NCT, PKG, gpu, nct, rapl, tick


def pol(text: str):
    return load_policy_text(textwrap.dedent(text), name="t")


def zone(name: str, max_w: float) -> Device:
    dev = f"powercap:{name}"
    return Device(dev, DeviceKind.POWERCAP, name, (),
                  (Knob(f"{dev}/pl1", dev, KnobKind.PL1, "W", 1.0, max_w, max_w / 2, True),))


def k10_with_ccds() -> Device:
    temps = (("temp1", "Tctl"), ("temp3", "Tccd1"), ("temp4", "Tccd2"))
    chans = tuple(Channel(f"{K10}/{attr}", K10, attr, Quantity.TEMPERATURE, "°C", label=label)
                  for attr, label in temps)
    return Device(K10, DeviceKind.HWMON, "k10temp", chans, chip="k10temp-pci-00c3")


def test_rapl_zones_by_name_pattern_and_device_id():
    p = pol("""
        rules:
          - {name: dram, kind: cpu_power_limit, zones: dram, pl1_w: 10}
          - {name: pkg, kind: cpu_power_limit, zones: "powercap:package-0", pl1_w: 90, pl2_w: 120}
          - {name: core, kind: cpu_power_limit, zones: [core], pl1_w: 60}
          - {name: rest, kind: cpu_power_limit, pl1_w: 5}
        """)
    res = evaluate(p, (), tick([rapl(), zone("dram", 50.0), zone("core", 200.0)], 0.0, {}), initial_state())
    assert {k: (d.value, d.rule) for k, d in res.decisions.items()} == {
        "powercap:dram/pl1": (10.0, "t/dram"), f"{PKG}/pl1": (90.0, "t/pkg"), f"{PKG}/pl2": (120.0, "t/pkg"),
        "powercap:core/pl1": (60.0, "t/core")}


CURVES = """
curves:
  coolest-ccd: {kind: points, source: {min: ["Tccd*"]}, points: [[0, 0], [100, 100]]}
  mean: {kind: points, source: {mean: ["Tccd*", "gpu0/temperature"]}, points: [[0, 0], [100, 100]]}
  by-id: {kind: points, source: "hwmon:k10temp-*/temp1", points: [[0, 0], [100, 100]]}
rules:
  - {name: a, kind: fan, fans: ["*/pwm1"], curve: coolest-ccd}
  - {name: b, kind: fan, fans: {id: "hwmon:nct*/pwm2"}, curve: mean}
  - {name: c, kind: fan, fans: "gpu0/fan*", curve: by-id}
  - name: hot-ccd
    kind: gpu_power_limit
    when: {metric: temperature_c, sensor: "tccd*", stat: last, above: 70}
    limit: min
"""


@pytest.mark.parametrize("ccd2, limited", [(72.0, True), (69.0, False)])
def test_sources_by_id_or_label_combined_by_min_mean_and_max(ccd2, limited):
    values = {f"{K10}/temp1": 55.0, f"{K10}/temp3": 40.0, f"{K10}/temp4": ccd2, "gpu0/temperature": 62.0}
    res = evaluate(pol(CURVES), (), tick([nct(), k10_with_ccds(), gpu(0)], 0.0, values), initial_state())
    duty = {k: d.value for k, d in res.decisions.items() if "pwm" in k or "fan" in k}
    assert duty == {f"{NCT}/pwm1": 40.0,  # min of Tccd1, Tccd2
                    f"{NCT}/pwm2": pytest.approx((40.0 + ccd2 + 62.0) / 3),  # mean of every match
                    "gpu0/fan0": 55.0}  # Tctl by its channel id
    # a label pattern matches case-insensitively; several matches count as their maximum
    assert ("gpu0/power_limit" in res.decisions) is limited
