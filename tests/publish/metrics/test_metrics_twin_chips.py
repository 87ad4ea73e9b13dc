"""Twin chips (two ACPI thermal zones, both ``acpitz-acpi-0`` to lm-sensors) are two series in every
metric and two devices in the D-Bus document, read from a recorded machine by the real backend."""

from __future__ import annotations

import os
import shutil

from metrics_helpers import handle_with
from prometheus_client.parser import text_string_to_metric_families

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Snapshot
from aithermd.publish import metrics
from aithermd.publish.document import snapshot_document
from tests.support.machines import copy_machine


def twin_machine(tmp_path):
    root = copy_machine(tmp_path, "asus-rog-strix-z690-e-alderlake-coretemp-nvme")
    acpi = root / "devices" / "LNXSYSTM:00"
    shutil.copytree(acpi / "LNXTHERM:00", acpi / "LNXTHERM:01", symlinks=True)
    (acpi / "LNXTHERM:01" / "hwmon" / "hwmon1").rename(acpi / "LNXTHERM:01" / "hwmon" / "hwmon9")
    (acpi / "LNXTHERM:01" / "hwmon" / "hwmon9" / "temp1_input").write_text("41000\n")
    os.symlink("../../devices/LNXSYSTM:00/LNXTHERM:01/hwmon/hwmon9", root / "class" / "hwmon" / "hwmon9")
    return root


def test_twin_chips_are_distinct_series_and_devices(tmp_path):
    backend = HwmonBackend(str(twin_machine(tmp_path)))
    devices = tuple(backend.discover())
    sample = backend.sample()
    backend.close()
    snap = Snapshot(seq=1, t_mono=1.0, t_wall=1.0, devices=devices, readings=sample.readings)
    _, handle = handle_with(snap)
    text = metrics.render(handle).decode()
    seen: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in seen, f"duplicate series {key}"
            seen[key] = s.value
    acpitz = {dict(ls)["chip"]: v for (n, ls), v in seen.items()
              if n == "aithermd_temperature_celsius" and dict(ls)["chip"].startswith("acpitz")}
    assert acpitz == {"acpitz-acpi-0": 27.8, "acpitz-acpi-0#2": 41.0}
    doc = snapshot_document(snap)
    ids = [d["id"] for d in doc["devices"]]
    assert ids.count("hwmon:acpitz-acpi-0") == 1 and ids.count("hwmon:acpitz-acpi-0#2") == 1
    handle.stop()
