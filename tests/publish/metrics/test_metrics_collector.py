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
    # a fan without a label is named by its sensor; RPM and duty share chip, node_chip, sensor and label
    assert value(found, "aithermd_fan_speed_rpm", chip="nct6798-isa-0290", sensor="fan1", label="fan1") > 0
    # (the reference device has no bus_path, so node_chip falls back to its name)
    fan1 = {"chip": "nct6798-isa-0290", "node_chip": "nct6798", "sensor": "fan1", "label": "fan1"}
    assert value(found, "aithermd_fan_speed_rpm", **fan1) > 0
    assert value(found, "aithermd_fan_duty_ratio", knob="hwmon:nct6798-isa-0290/pwm1", **fan1) == 0.5
    assert value(found, "aithermd_fan_duty_ratio", knob="gpu1/fan0") == 0.43
    rpm_labels = {frozenset(k for k, _ in ls) for (n, ls) in found if n == "aithermd_fan_speed_rpm"}
    duty_labels = {frozenset(k for k, _ in ls) - {"knob"} for (n, ls) in found
                   if n == "aithermd_fan_duty_ratio"}
    assert rpm_labels == duty_labels == {frozenset(fan1)}
    # CPU package power is one series: the package zone of aithermd_rapl_power_watts
    assert value(found, "aithermd_rapl_power_watts", zone="package-0") == r["powercap:package-0/power"].value
    assert "aithermd_cpu_package_power_watts" not in names(found)
    assert value(found, "aithermd_rapl_energy_joules_total", zone="dram") == r["powercap:dram/energy"].value
    assert value(found, "aithermd_rapl_power_watts", zone="dram") == r["powercap:dram/power"].value
    # dcgm-exporter's join labels on every GPU series
    assert value(found, "aithermd_gpu_power_watts", gpu="0", UUID=GPU0["gpu_uuid"]) == r["gpu0/power"].value
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
    # it comes back: its counters go on from where they were, never from 0 (a reset to rate())
    hub.publish(reference_snapshot(4), [Event("fault", 4.0, "gpu1", "GPU is lost", {"device": "gpu1"})])
    back = scrape(handle)
    assert value(back, "aithermd_faults_total", device="gpu1") == 2.0
    assert value(back, "aithermd_drift_total", knob="gpu1/fan0") == 1.0
    # its limit's decision before it left, and again on its return
    assert value(back, "aithermd_decisions_total", knob="gpu1/power_limit", rule="balanced/power_limit") == 2


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


def test_before_the_first_tick_only_build_info_the_histogram_and_the_process():
    handle = metrics.start("none", StateHub())
    found = {n for n in names(scrape(handle)) if not n.startswith(("process_", "python_"))}
    assert found <= {"aithermd_build_info", "aithermd_tick_duration_seconds_bucket",
                     "aithermd_tick_duration_seconds_count", "aithermd_tick_duration_seconds_sum",
                     "aithermd_tick_duration_seconds_created"}
    # the daemon's own process, as every Prometheus client exports it
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
            "process_start_time_seconds", "python_info"} <= names(scrape(handle))
    handle.stop()


def test_fault_and_drift_counters_exist_at_zero_for_every_device_and_knob_from_the_start():
    """increase(aithermd_faults_total[10m]) > 0 must see a device's first fault: the series exists at 0
    from the moment the device is known (a series born at 1 increases by nothing)."""
    snap = reference_snapshot(1, gpus=1)
    hub, handle = handle_with(snap)
    found = scrape(handle)
    devices = {d.id for d in snap.devices}
    knobs = {k.id for d in snap.devices for k in d.knobs}
    faults = {dict(ls)["device"]: v for (n, ls), v in found.items() if n == "aithermd_faults_total"}
    drift = {dict(ls)["knob"]: v for (n, ls), v in found.items() if n == "aithermd_drift_total"}
    assert faults == dict.fromkeys(devices, 0.0) and drift == dict.fromkeys(knobs, 0.0)
    hub.publish(reference_snapshot(2, gpus=1), [Event("fault", 1.0, "gpu0/temperature", "read failed",
                                                      {"device": "gpu0"})])
    assert value(scrape(handle), "aithermd_faults_total", device="gpu0") == 1.0
    # hotplug: a second GPU appears; its counters start at 0 too, and gpu0 keeps its count
    hub.publish(reference_snapshot(3, gpus=2))
    found = scrape(handle)
    assert value(found, "aithermd_faults_total", device="gpu1") == 0.0
    assert value(found, "aithermd_drift_total", knob="gpu1/power_limit") == 0.0
    assert value(found, "aithermd_faults_total", device="gpu0") == 1.0
    hub.publish(reference_snapshot(4, gpus=1))  # and it goes when the GPU goes
    assert not [ls for (n, ls) in scrape(handle) if n == "aithermd_faults_total" and ("device", "gpu1") in ls]


def test_hwmon_series_carry_node_exporters_chip_name_on_a_recorded_machine():
    """node_exporter names a hwmon chip by its device's bus directory and name (hwmon_linux.go, hwmonName):
    node_hwmon_temp_celsius{chip="pci0000:00_0000:00:18_3",sensor="temp1"} for k10temp. The same value is
    aithermd's node_chip label, so the two join on (node_chip=chip, sensor)."""
    from pathlib import Path

    from aithermd.backends.hwmon import HwmonBackend

    root = Path(__file__).parents[2] / "fixtures/sysfs/asus-rog-strix-x570-f-nct6798-amdgpu-k10temp/sys"
    backend = HwmonBackend(str(root))
    try:
        chips = {d.id: metrics.node_exporter_chip(d) for d in backend.discover()}
    finally:
        backend.close()
    assert chips == {"hwmon:k10temp-pci-00c3": "pci0000:00_0000:00:18_3",
                     "hwmon:amdgpu-pci-0700": "pci0000:00_0000:07:00_0",
                     "hwmon:nct6798-isa-0290": "platform_nct6775_656"}


def test_a_rapl_limit_of_zero_is_no_limit_not_a_cap_of_zero_watts():
    """powercap reports 0 µW for a constraint no one set (a core zone's PL1): no series, not 0 W."""
    from types import MappingProxyType

    from aithermd.model import KnobValue

    snap = reference_snapshot(1)
    knobs = dict(snap.knobs)
    knobs["powercap:package-0/pl1"] = KnobValue("powercap:package-0/pl1", 0.0)
    _, handle = handle_with(replace(snap, knobs=MappingProxyType(knobs)))
    found = scrape(handle)
    limits = {dict(ls)["constraint"] for (n, ls) in found if n == "aithermd_rapl_power_limit_watts"}
    assert limits == {"pl2"}
