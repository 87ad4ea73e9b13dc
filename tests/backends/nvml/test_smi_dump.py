"""nvidia-smi -q dumps (text and XML, recorded on real machines) → GpuProfile."""

from pathlib import Path

import pytest

from aithermd.sim.smi_dump import DumpError, load_dump, parse_dump

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi-q"

# file, GPUs, first GPU: bus id, name, management limit, enforced, default, min, max (W),
# slowdown, shutdown (°C)
EXPECTED = [
    ("a10-nvidia-smi-q.txt", 1, "00000000:08:00.0", "NVIDIA A10", 150, 150, 150, 100, 150, 98, 101),
    ("a100-sxm4-80gb-nvidia-smi-q-x.xml", 1, "00000000:01:00.0", "NVIDIA A100-SXM4-80GB",
     500, 500, 500, 100, 500, 89, 92),
    ("a100-sxm4-mig-nvidia-smi-q-x.xml", 1, "00000000:00:04.0", "NVIDIA A100-SXM4-40GB",
     400, 400, 400, 100, 400, 89, 92),
    ("a100-sxm4-x4-nvidia-smi-q.txt", 4, "00000000:68:00.0", "NVIDIA A100-SXM4-80GB",
     500, 500, 500, 100, 500, 89, 92),
    ("a10g-nvidia-smi-q-x.xml", 1, "00000000:00:1E.0", "NVIDIA A10G", 300, 300, 300, 100, 300, 95, 98),
    ("a40-x10-nvidia-smi-q.txt", 10, "00000000:4F:00.0", "NVIDIA A40", 300, 300, 300, 100, 300, 95, 98),
    ("gh200-nvidia-smi-q.txt", 1, "00000000:DD:00.0", "NVIDIA GH200 480GB", 900, 700, 900, 100, 900, 88, 94),
    ("gtx1660ti-nvidia-smi-q-x.xml", 1, "00000000:43:00.0", "Graphics Device",
     130, 130, 130, 70, 130, 93, 96),
    ("h100-80gb-hbm3-nvidia-smi-q-idle-and-load.txt", 1, "00000000:00:09.0", "NVIDIA H100 80GB HBM3",
     700, 700, 700, 200, 700, 89, 95),
    ("h100-mig-enabled-nvidia-smi-q-idle-and-load.txt", 1, "00000000:00:09.0", "NVIDIA H100 80GB HBM3",
     700, 700, 700, 200, 700, 89, 95),
    ("h100-nvl-x2-nvidia-smi-q.txt", 2, "00000000:AD:00.0", "NVIDIA H100 NVL",
     310, 310, 310, 200, 400, 89, 95),
    ("h100-sxm5-x8-nvidia-smi-q.txt", 8, "00000000:18:00.0", "NVIDIA H100 80GB HBM3",
     700, 700, 700, 200, 700, 89, 95),
    ("h200-141gb-nvidia-smi-q-idle-and-load.txt", 1, "00000000:83:00.0", "NVIDIA H200",
     700, 700, 700, 200, 700, 89, 95),
    ("l4-nvidia-smi-q.txt", 1, "00000000:01:00.0", "NVIDIA L4", 72, 72, 72, 40, 72, 88, 91),
    ("l40s-nvidia-smi-q-idle-and-load.txt", 1, "00000000:01:00.0", "NVIDIA L40S",
     350, 350, 350, 100, 350, 90, 93),
    ("quadro-p2000-nvidia-smi-q-x.xml", 1, "00000000:17:00.0", "Quadro P2000", 75, 75, 75, 75, 75, 101, 104),
    ("rtx-a5000-x2-nvidia-smi-q-x.xml", 2, "00000000:81:00.0", "NVIDIA RTX A5000",
     230, 230, 230, 100, 230, 95, 98),
    ("rtx-a6000-nvidia-smi-q-windows-idle.txt", 1, "00000000:01:00.0", "NVIDIA RTX A6000",
     300, 300, 300, 100, 300, 95, 98),
    ("rtx-a6000-x9-nvidia-smi-q-linux.txt", 9, "00000000:4F:00.0", "NVIDIA RTX A6000",
     300, 300, 300, 100, 300, 95, 98),
    ("rtx-pro-6000-blackwell-maxq-nvidia-smi-q-x.xml", 1, "00000000:61:00.0",
     "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 300, 300, 300, 250, 325, 94, 97),
    ("rtx2000-ada-nvidia-smi-q.txt", 1, "00000000:02:00.0", "NVIDIA RTX 2000 Ada Generation",
     70, 70, 70, 30, 70, 97, 102),
    ("rtx2080-x2-nvidia-smi-q-x.xml", 2, "00000000:01:00.0", "NVIDIA GeForce RTX 2080",
     215, 215, 215, 105, 240, 97, 100),
    ("rtx2080super-nvidia-smi-q-idle-and-load.txt", 1, "00000000:0C:00.0", "NVIDIA GeForce RTX 2080 SUPER",
     250, 250, 250, 105, 350, 97, 100),
    ("rtx3060-nvidia-smi-q-x.xml", 1, "00000000:2D:00.0", "NVIDIA GeForce RTX 3060",
     170, 170, 170, 100, 190, 95, 98),
    ("rtx3080-nvidia-smi-q-x.xml", 1, "00000000:0C:00.0", "NVIDIA GeForce RTX 3080",
     320, 320, 320, 100, 336, 95, 98),
    ("rtx3090-nvidia-smi-q-x-driver-v13.xml", 1, "00000000:09:00.0", "NVIDIA GeForce RTX 3090",
     350, 350, 350, 100, 480, 95, 98),
    ("rtx3090-x2-rtx3090ti-x2-nvidia-smi-q-d-power-clock.txt", 4, "00000000:01:00.0", "",
     480, 480, 480, 100, 480, None, None),
    ("rtx4000-sff-ada-nvidia-smi-q-x.xml", 1, "00000000:06:00.0", "NVIDIA RTX 4000 SFF Ada Generation",
     70, 70, 70, 30, 70, 89, 94),
    ("rtx4060ti-x2-nvidia-smi-q.txt", 2, "00000000:03:00.0", "NVIDIA GeForce RTX 4060 Ti",
     165, 165, 165, 100, 165, 84, 89),
    ("rtx4080super-nvidia-smi-q-idle-and-load.txt", 1, "00000000:01:00.0", "NVIDIA GeForce RTX 4080 SUPER",
     320, 320, 320, 150, 400, 96, 101),
    ("rtx4090-nvidia-smi-q-x-driver535.xml", 1, "00000000:84:00.0", "NVIDIA GeForce RTX 4090",
     450, 450, 450, 10, 600, 85, 90),
    ("rtx4090-x8-nvidia-smi-q.txt", 8, "00000000:01:00.0", "NVIDIA GeForce RTX 4090",
     450, 450, 450, 150, 450, 86, 91),
    ("rtx5090-nvidia-smi-q.txt", 1, "00000000:02:00.0", "NVIDIA GeForce RTX 5090",
     575, 575, 575, 400, 575, 92, 95),
    ("rtx6000-ada-x8-nvidia-smi-q.txt", 8, "00000000:01:00.0", "NVIDIA RTX 6000 Ada Generation",
     300, 300, 300, 100, 300, 93, 98),
    ("tesla-p100-nvidia-smi-q-x.xml", 1, "00000000:00:04.0", "Tesla P100-PCIE-16GB",
     250, 250, 250, 125, 250, 82, 85),
    ("tesla-t4-nvidia-smi-q-x.xml", 1, "00000000:00:1E.0", "Tesla T4", 70, 70, 70, 60, 70, 93, 96),
    ("v100-sxm2-x8-nvidia-smi-q.txt", 8, "00000000:00:04.0", "Tesla V100-SXM2-16GB",
     300, 300, 300, 150, 300, 87, 90),
]


def test_the_table_covers_every_recorded_dump():
    assert sorted(row[0] for row in EXPECTED) == sorted(p.name for p in DUMPS.iterdir())
    assert len(EXPECTED) == 37


@pytest.mark.parametrize(
    ("fname", "count", "bus", "name", "pl", "enforced", "default", "lo", "hi", "slow", "shut"),
    EXPECTED, ids=[row[0] for row in EXPECTED])
def test_every_dump_parses_with_its_limits(fname, count, bus, name, pl, enforced, default, lo, hi, slow,
                                           shut):
    gpus = load_dump(DUMPS / fname)
    assert len(gpus) == count
    g = gpus[0]
    assert (g.pci_bus_id, g.name) == (bus, name)
    assert (g.power_limit_w, g.enforced_power_limit_w, g.default_power_limit_w) == (pl, enforced, default)
    assert (g.min_power_limit_w, g.max_power_limit_w) == (lo, hi)
    assert (g.slowdown_temp_c, g.shutdown_temp_c) == (slow, shut)
    assert len({p.pci_bus_id for p in gpus}) == count, "GPUs are told apart by bus id"
    assert all(p.uuid is None for p in gpus), "public dumps mask the UUID"
    assert g.source == fname


def test_text_dump_fields_of_an_h200_idle_then_load():
    (g,) = load_dump(DUMPS / "h200-141gb-nvidia-smi-q-idle-and-load.txt")
    assert g.driver_version == "590.48.01" and g.architecture == "Hopper" and g.persistence_mode is True
    assert (g.temp_c, g.memory_temp_c, g.power_draw_w) == (28, 32, 77.67)
    # T.Limit margins: 28 °C + 59 = 87 °C T.Limit; shutdown −8, slowdown −2, max operating 0
    assert (g.tlimit_temp_c, g.shutdown_temp_c, g.slowdown_temp_c, g.max_operating_temp_c) == (87, 95, 89, 87)
    assert (g.sm_clock_mhz, g.memory_clock_mhz, g.max_sm_clock_mhz) == (345, 3201, 1980)
    assert (g.memory_total_mib, g.memory_used_mib, g.fan_speeds_pct) == (143771, 0, ())
    assert g.clock_event_reasons == ("gpu_idle",) and g.pstate == "P0"
    assert [s.label for s in g.snapshots] == ["idle", "load"]
    load = g.snapshots[1]
    assert (load.temp_c, load.power_draw_w, load.gpu_util_pct, load.sm_clock_mhz) == (52, 627.32, 100, 1980)


def test_old_xml_uses_power_limit_and_enforced_power_limit():
    (g,) = load_dump(DUMPS / "tesla-t4-nvidia-smi-q-x.xml")
    assert (g.power_limit_w, g.enforced_power_limit_w, g.power_draw_w) == (70, 70, 26.78)
    assert (g.max_operating_temp_c, g.fan_speeds_pct, g.persistence_mode) == (85, (), False)
    assert g.driver_version == "515.105.01"


def test_xml_clock_event_reasons_fans_and_memory_temperature():
    (g,) = load_dump(DUMPS / "a100-sxm4-80gb-nvidia-smi-q-x.xml")
    assert (g.memory_temp_c, g.memory_max_temp_c, g.max_operating_temp_c) == (44, 95, 85)
    (r,) = load_dump(DUMPS / "quadro-p2000-nvidia-smi-q-x.xml")
    assert r.fan_speeds_pct == (46,) and r.target_temp_c == 83 and r.max_operating_temp_c is None
    (s,) = load_dump(DUMPS / "rtx3090-nvidia-smi-q-x-driver-v13.xml")
    assert s.clock_event_reasons == ("sw_power_cap",)


def test_power_then_clock_dump_merges_by_bus_id_without_product_name():
    gpus = load_dump(DUMPS / "rtx3090-x2-rtx3090ti-x2-nvidia-smi-q-d-power-clock.txt")
    assert [g.pci_bus_id for g in gpus] == ["00000000:01:00.0", "00000000:21:00.0",
                                           "00000000:C1:00.0", "00000000:E1:00.0"]
    assert [g.max_power_limit_w for g in gpus] == [480, 450, 450, 450]
    assert [g.default_power_limit_w for g in gpus] == [480, 420, 420, 450]
    assert all(g.name == "" and g.temp_c is None for g in gpus)
    assert gpus[0].max_sm_clock_mhz == 2115 and gpus[0].sm_clock_mhz == 210, "CLOCK capture filled in"
    assert len(gpus[0].snapshots) == 2


def test_driver_610_ceiling_power_limit_and_kmd_version():
    (g,) = load_dump(DUMPS / "rtx2080super-nvidia-smi-q-idle-and-load.txt")
    assert g.driver_version == "610.57.04"
    assert (g.power_limit_w, g.default_power_limit_w, g.max_power_limit_w) == (250, 250, 350)
    assert g.target_temp_c == 84  # "GPU Target Temperature Specification"


def test_windows_dump_without_persistence_mode():
    (g,) = load_dump(DUMPS / "rtx-a6000-nvidia-smi-q-windows-idle.txt")
    assert g.persistence_mode is None and g.fan_speeds_pct == (35,)


def test_unmasked_uuid_and_serial_are_kept():
    text = (DUMPS / "a10-nvidia-smi-q.txt").read_text()
    real = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
    text = text.replace("GPU-00000000-0000-0000-0000-000000000000", real)
    (g,) = parse_dump(text, source="x")
    assert g.uuid == real and g.serial is None


def test_bad_input_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("hello\n")
    with pytest.raises(DumpError, match=r"empty.txt: error: no GPU found"):
        load_dump(empty)
    broken = tmp_path / "broken.xml"
    broken.write_text("<nvidia_smi_log>\n<gpu id='0'>\n")
    with pytest.raises(DumpError, match=r"broken.xml:\d+: error: malformed XML"):
        load_dump(broken)
    with pytest.raises(DumpError, match="cannot read"):
        load_dump(tmp_path / "missing.txt")
