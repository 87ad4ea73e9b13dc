"""CPU backend with an injected psutil, the backend registry, inventory, the sensors document and ttar."""

from __future__ import annotations

from collections import namedtuple

import pytest

from aithermd.backends.cpu import CpuBackend
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.powercap import RaplBackend
from aithermd.backends.registry import discover, open_backend, open_backends
from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, KnobValue, Quantity, Reading, Status
from aithermd.publish.sensors import render_table, sensors_document
from aithermd.sim import ttar

from .helpers import MACHINES_DIR

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
Freq = namedtuple("Freq", "current min max")


class FakePsutil:
    def __init__(self) -> None:
        self.times = [Times(10, 0, 5, 85, 0, 0, 0, 0, 0, 0), Times(1, 0, 1, 98, 0, 0, 0, 0, 0, 0)]
        self.freq: Freq | None = Freq(3400.0, 800.0, 5000.0)

    def cpu_times(self, percpu=False):
        return list(self.times)

    def cpu_freq(self):
        return self.freq

    def getloadavg(self):
        return (1.5, 1.0, 0.5)


def test_cpu_utilization_load_and_frequency():
    ps = FakePsutil()
    backend = CpuBackend(psutil_module=ps, per_cpu=True)
    (dev,) = backend.discover()
    assert [c.attribute for c in dev.channels] == [
        "utilization",
        "cpu0",
        "cpu1",
        "load1",
        "load5",
        "load15",
        "frequency",
    ]
    # cpu0: 30 busy of 100 s; cpu1: 0 busy of 100 s (iowait counts as idle)
    ps.times = [Times(30, 0, 15, 145, 10, 0, 0, 0, 0, 0), Times(1, 0, 1, 190, 8, 0, 0, 0, 0, 0)]
    r = backend.sample().readings
    assert r["cpu/cpu0"].value == pytest.approx(30.0)
    assert r["cpu/cpu1"].value == pytest.approx(0.0)
    assert r["cpu/utilization"].value == pytest.approx(15.0)
    assert (r["cpu/load1"].value, r["cpu/load15"].value) == (1.5, 0.5)
    assert r["cpu/frequency"].value == 3400.0 and dev.channels[-1].unit == "MHz"
    still = backend.sample().readings  # no CPU time passed
    assert still["cpu/utilization"].status == Status.STALE and still["cpu/cpu0"].value is None


def test_cpu_without_frequency():
    ps = FakePsutil()
    ps.freq = None
    (dev,) = CpuBackend(psutil_module=ps).discover()
    assert "frequency" not in [c.attribute for c in dev.channels]


def test_open_backend_rebuilds_from_locator(tmp_path):
    hw = HwmonBackend(str(tmp_path))
    again = open_backend(hw.locator())
    assert isinstance(again, HwmonBackend) and again.sysfs_root == str(tmp_path)
    assert isinstance(open_backend(RaplBackend(str(tmp_path)).locator()), RaplBackend)
    assert isinstance(open_backend({"backend": "cpu"}), CpuBackend)
    with pytest.raises(ValueError, match="unknown backend"):
        open_backend({"backend": "floppy"})


def test_inventory_discovers_every_backend_and_skips_a_broken_one():
    root = str(MACHINES_DIR / "laptop-amd-k10temp-amdgpu-nct6779-asus-nvme" / "sys")
    backends = open_backends(root, cpu=False)
    assert [b.kind for b in backends] == ["hwmon", "powercap", "thermal", "cpuknobs", "hwmon-gpu"]

    class Broken:
        kind = "broken"

        def discover(self):
            raise OSError("boom")

    devices = discover([*backends, Broken()]).devices
    assert [d.id for d in devices][:3] == [
        "hwmon:acpitz-acpi-0",
        "hwmon:BAT0-acpi-0",
        "hwmon:k10temp-pci-00c3",
    ]
    assert len(devices) == 9
    assert [d.id for d in devices][-2:] == ["gpu0", "gpu1"]  # the laptop's two amdgpu chips, in bus order
    for b in backends:
        b.close()


def test_document_shape_and_fallbacks():
    ch = Channel("hwmon:x-isa-0000/temp1", "hwmon:x-isa-0000", "temp1", Quantity.TEMPERATURE, "°C")
    ch2 = Channel("hwmon:x-isa-0000/fan1", "hwmon:x-isa-0000", "fan1", Quantity.FAN, "RPM", label="CPU fan")
    knob = Knob(
        "hwmon:x-isa-0000/pwm1",
        "hwmon:x-isa-0000",
        KnobKind.PWM,
        "%",
        0.0,
        100.0,
        writable=False,
        why_not="pwm1 not writable (needs root)",
    )
    hw = Device("hwmon:x-isa-0000", DeviceKind.HWMON, "x", (ch, ch2), (knob,), chip="x-isa-0000")
    cpu = Device("cpu", DeviceKind.CPU, "CPU", ())
    readings = {ch.id: Reading(ch.id, None, Status.FAILED, "EIO")}
    doc = sensors_document([hw, cpu], readings, {knob.id: KnobValue(knob.id, 40.0, "auto")})
    assert doc == {
        "devices": [
            {
                "id": "hwmon:x-isa-0000",
                "kind": "hwmon",
                "name": "x",
                "chip": "x-isa-0000",
                "channels": [
                    {
                        "id": ch.id,
                        "attribute": "temp1",
                        "label": "temp1",
                        "alias": None,
                        "value": None,
                        "unit": "°C",
                        "status": "failed",
                        "reason": "EIO",
                    },
                    {
                        "id": ch2.id,
                        "attribute": "fan1",
                        "label": "CPU fan",
                        "alias": None,
                        "value": None,
                        "unit": "RPM",
                        "status": "stale",
                        "reason": "no reading",
                    },
                ],
                "knobs": [
                    {
                        "id": knob.id,
                        "kind": "pwm",
                        "value": 40.0,
                        "unit": "%",
                        "min": 0.0,
                        "max": 100.0,
                        "default": None,
                        "writable": False,
                        "why_not": "pwm1 not writable (needs root)",
                    }
                ],
            },
            {"id": "cpu", "kind": "cpu", "name": "CPU", "channels": [], "knobs": []},
        ]
    }
    with_attrs = sensors_document([cpu], {}, {}, attrs={"cpu": {"governor": "performance"}})
    assert with_attrs["devices"][0]["attrs"] == {"governor": "performance"}
    table = render_table(doc)
    assert "hwmon:x-isa-0000  (x)" in table and "[failed: EIO]" in table and "[stale: no reading]" in table
    assert "read-only: pwm1 not writable (needs root)" in table
    assert render_table({"devices": []}) == "no devices found\n"


def test_ttar_parse_special_lines(tmp_path):
    text = "\n".join(
        [
            "# comment",
            "Directory: a",
            "Mode: 755",
            "# ttar - - -",
            "Path: a/f",
            "Lines: 2",
            "one",
            "twoNULLBYTEEOF",
            "Mode: 444",
            "# ttar - - -",
            "Path: a/link",
            "SymlinkTo: f",
            "# ttar - - -",
            "Path: a/empty",
            "Lines: 0",
            "Mode: 644",
            "",
        ]
    )
    archive = tmp_path / "x.ttar"
    archive.write_text(text)
    entries = ttar.read(archive)
    assert [(e.kind, e.path) for e in entries] == [
        ("dir", "a"),
        ("file", "a/f"),
        ("link", "a/link"),
        ("file", "a/empty"),
    ]
    assert entries[1].data == b"one\ntwo\0" and entries[1].mode == 0o444
    ttar.extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "a" / "link").is_symlink()
    assert (tmp_path / "out" / "a" / "link").read_bytes() == b"one\ntwo\0"
    assert (tmp_path / "out" / "a" / "empty").read_bytes() == b""
    bad = tmp_path / "bad.ttar"
    bad.write_text("Path: a\nLines: 3\nx\n")
    with pytest.raises(ttar.TtarError, match="bad.ttar:2"):
        ttar.read(bad)
    escape = tmp_path / "escape.ttar"
    escape.write_text("Path: ../evil\nLines: 0\n")
    with pytest.raises(ValueError, match="leaves the destination"):
        ttar.extract(escape, tmp_path / "out2")
