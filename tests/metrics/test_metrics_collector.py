"""The collector renders the last published snapshot: names, labels, values, vanished devices."""

from __future__ import annotations

from dataclasses import replace

import pytest
from metrics_helpers import handle_with, names, scrape, value

from aithermd import __version__
from aithermd.model import Event, Hold, Layer, Reading, Status
from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot

GPU0 = {"gpu_index": "0", "gpu_uuid": "GPU-1a2b3c4d-0000-4000-8000-000000000000",
        "gpu_name": "NVIDIA GeForce RTX 4090"}


def test_gpu_metrics_in_base_units_with_index_uuid_and_name():
    snap = reference_snapshot(1)
    _, handle = handle_with(snap)
    found = scrape(handle)
    r = snap.readings
    assert value(found, "aithermd_gpu_temperature_celsius", **GPU0) == r["gpu0/temperature"].value
    memory = r["gpu0/memory_temperature"].value
    assert value(found, "aithermd_gpu_memory_temperature_celsius", **GPU0) == memory
    assert value(found, "aithermd_gpu_power_watts", **GPU0) == r["gpu0/power"].value
    assert value(found, "aithermd_gpu_power_limit_watts", **GPU0) == 450.0
    assert value(found, "aithermd_gpu_enforced_power_limit_watts", **GPU0) == 450.0
    assert value(found, "aithermd_gpu_energy_joules_total", **GPU0) == r["gpu0/energy"].value == 1100.0
    assert value(found, "aithermd_gpu_utilization_ratio", **GPU0) == pytest.approx(
        r["gpu0/utilization"].value / 100)
    assert value(found, "aithermd_gpu_clock_event_reason", reason="sw_power_cap", **GPU0) == 1.0
    assert value(found, "aithermd_gpu_clock_event_reason", reason="hw_slowdown", **GPU0) == 0.0
    assert value(found, "aithermd_build_info", version=__version__) == 1.0


def test_hwmon_powercap_and_policy_metrics():
    hold = Hold(cookie=1, policy="quiet", reason="call", owner=":1.5")
    snap = reference_snapshot(3, holds=(hold, replace(hold, cookie=2)))
    _, handle = handle_with(snap)
    found = scrape(handle)
    r = snap.readings
    assert value(found, "aithermd_temperature_celsius", chip="k10temp-pci-00c3", sensor="temp1",
                 label="Tctl") == r["hwmon:k10temp-pci-00c3/temp1"].value
    assert value(found, "aithermd_fan_speed_rpm", chip="nct6798-isa-0290", sensor="fan2",
                 label="CPU fan") == r["hwmon:nct6798-isa-0290/fan2"].value
    assert value(found, "aithermd_fan_speed_rpm", chip="nct6798-isa-0290", sensor="fan1", label="") > 0
    assert value(found, "aithermd_fan_duty_ratio", knob="hwmon:nct6798-isa-0290/pwm1") == 0.5
    assert value(found, "aithermd_fan_duty_ratio", knob="gpu1/fan0") == 0.43
    assert value(found, "aithermd_cpu_package_power_watts", zone="package-0") == r[
        "powercap:package-0/power"].value
    assert value(found, "aithermd_rapl_energy_joules_total", zone="dram") == r["powercap:dram/energy"].value
    assert value(found, "aithermd_rapl_power_watts", zone="dram") == r["powercap:dram/power"].value
    assert not [ls for (n, ls), _ in found.items()  # dram is a RAPL zone, not a CPU package
                if n == "aithermd_cpu_package_power_watts" and ("zone", "dram") in ls]
    assert value(found, "aithermd_gpu_clock_event_reason", gpu_index="0", reason="board_limit") == 0.0
    assert value(found, "aithermd_rapl_power_limit_watts", zone="package-0", constraint="pl1") == 125.0
    assert value(found, "aithermd_rapl_power_limit_watts", zone="package-0", constraint="pl2") == 253.0
    assert value(found, "aithermd_policy_active", policy="balanced") == 1.0
    assert value(found, "aithermd_policy_holds", policy="quiet") == 2.0
    assert value(found, "aithermd_failsafe_active", knob="gpu0/power_limit") == 0.0
    assert value(found, "aithermd_snapshot_timestamp_seconds") == snap.t_wall


def test_a_failed_reading_is_absent_not_zero_and_failsafe_shows():
    snap = reference_snapshot(1)
    readings = dict(snap.readings)
    readings["gpu0/temperature"] = Reading("gpu0/temperature", None, Status.FAILED, "NVML_ERROR_UNKNOWN")
    decisions = dict(snap.decisions)
    decisions["gpu0/fan0"] = replace(decisions["gpu0/fan0"], layer=Layer.SAFETY, rule="safety/sensor-failed")
    _, handle = handle_with(replace(snap, readings=readings, decisions=decisions,
                                    degraded=("gpu0/temperature",)))
    found = scrape(handle)
    assert not [k for k in found if k[0] == "aithermd_gpu_temperature_celsius" and ("gpu_index", "0") in k[1]]
    assert value(found, "aithermd_failsafe_active", knob="gpu0/fan0") == 1.0
    assert value(found, "aithermd_degraded", id="gpu0/temperature") == 1.0


def test_label_sets_of_a_vanished_device_are_removed():
    hub, handle = handle_with(reference_snapshot(1))
    drift = Event("drift", 1.0, "gpu1/fan0", "fan0 reads 30 % after 60 %")
    lost = Event("fault", 2.0, "gpu1", "GPU is lost", {"device": "gpu1"})
    hub.publish(reference_snapshot(2), [drift, lost])
    before = scrape(handle)
    assert value(before, "aithermd_drift_total", knob="gpu1/fan0") == 1.0
    assert value(before, "aithermd_faults_total", device="gpu1") == 1.0
    assert value(before, "aithermd_gpu_power_watts", gpu_index="1") > 0
    hub.publish(reference_snapshot(3, gpus=1))
    after = scrape(handle)
    assert not [k for k in after if ("gpu_index", "1") in k[1]]
    assert not [k for k in after if any(v.startswith("gpu1") for _, v in k[1])]
    assert value(after, "aithermd_gpu_power_watts", gpu_index="0") > 0


def test_decision_drift_and_fault_counters_count():
    hub, handle = handle_with(reference_snapshot(1))
    first = scrape(handle)
    # the first snapshot's decisions count once each
    assert value(first, "aithermd_decisions_total", knob="gpu0/power_limit", rule="balanced/power_limit") == 1
    snap = reference_snapshot(1)
    for seq in (2, 3):
        decisions = dict(snap.decisions)
        decisions["gpu0/power_limit"] = replace(decisions["gpu0/power_limit"], value=300.0 + seq,
                                                rule="ai-training/raise")
        hub.publish(replace(snap, seq=seq, decisions=decisions),
                    [Event("drift", 1.0, "hwmon:nct6798-isa-0290/pwm2", "x"),
                     Event("conflict", 1.0, "hwmon:nct6798-isa-0290/pwm2", "fancontrol"),
                     Event("fault", 1.0, "hwmon:nct6798-isa-0290/temp2", "EIO")])
    found = scrape(handle)
    assert value(found, "aithermd_decisions_total", knob="gpu0/power_limit", rule="ai-training/raise") == 2
    assert value(found, "aithermd_decisions_total", knob="gpu0/power_limit", rule="balanced/power_limit") == 1
    assert value(found, "aithermd_decisions_total", knob="gpu0/fan0", rule="balanced/fan") == 1  # unchanged
    assert value(found, "aithermd_drift_total", knob="hwmon:nct6798-isa-0290/pwm2") == 4
    assert value(found, "aithermd_faults_total", device="hwmon:nct6798-isa-0290") == 2


def test_tick_duration_histogram():
    _, handle = handle_with(reference_snapshot(1))
    for seconds in (0.0004, 0.0009, 0.003, 0.2):
        handle.observe_tick(seconds)
    found = scrape(handle)
    assert value(found, "aithermd_tick_duration_seconds_count") == 4
    assert value(found, "aithermd_tick_duration_seconds_bucket", le="0.001") == 2
    assert value(found, "aithermd_tick_duration_seconds_bucket", le="0.25") == 4
    assert value(found, "aithermd_tick_duration_seconds_sum") == pytest.approx(0.2043)


def test_before_the_first_tick_only_build_info_and_the_histogram():
    handle = metrics.start("none", StateHub())
    assert names(scrape(handle)) <= {"aithermd_build_info", "aithermd_tick_duration_seconds_bucket",
                                     "aithermd_tick_duration_seconds_count",
                                     "aithermd_tick_duration_seconds_sum",
                                     "aithermd_tick_duration_seconds_created"}
    handle.stop()
