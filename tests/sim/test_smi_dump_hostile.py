"""Hostile ``--gpu-profile`` dumps: a FIFO hung sensors/replay/run --simulate, ``/dev/zero`` ate all memory,
impossible power limits (max below min, negative, zero default) reached the fake NVML (a negative max read
back as 4294367 W), and a dump without a default limit was a traceback in ``run --simulate``."""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import pytest

from aithermd.sim import runner
from aithermd.sim.smi_dump import DumpError, load_dump, parse_dump

ROOT = Path(__file__).resolve().parents[2]
RTX4090 = ROOT / "tests" / "fixtures" / "nvidia-smi-q" / "rtx4090-nvidia-smi-q-x-driver535.xml"
XML = RTX4090.read_text()


def test_a_fifo_or_device_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "d.xml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(DumpError) as info:
            load_dump(path)
        assert str(info.value) == f"{path}: error: cannot read: not a regular file"


@pytest.mark.parametrize(("old", "new", "values"), [
    ("<max_power_limit>600.00 W<", "<max_power_limit>-600 W<", "min 10 W, default 450 W, max -600 W"),
    ("<min_power_limit>10.00 W<", "<min_power_limit>900 W<", "min 900 W, default 450 W, max 600 W"),
    ("<default_power_limit>450.00 W<", "<default_power_limit>0 W<", "min 10 W, default 0 W, max 600 W"),
])
def test_impossible_power_limits_are_refused(old, new, values):
    assert old in XML
    with pytest.raises(DumpError) as info:
        parse_dump(XML.replace(old, new, 1), path="d.xml")
    assert str(info.value) == (f"d.xml: error: GPU 00000000:84:00.0: power limits make no sense ({values}, "
                               "limit 450 W): expected every limit > 0 and min ≤ default ≤ max")


def test_every_real_dump_still_loads():
    for path in sorted((ROOT / "tests" / "fixtures" / "nvidia-smi-q").iterdir()):
        assert load_dump(path), path.name


def test_simulate_refuses_a_gpu_without_a_default_limit_before_starting(tmp_path, capsys):
    dump = tmp_path / "d.txt"
    dump.write_text("==============NVSMI LOG==============\nAttached GPUs : 1\nGPU 00000000:01:00.0\n"
                    "    Product Name : X\n")
    args = argparse.Namespace(sim_duration_s=10.0, sim_speedup=0.0, sim_trace=None, sim_gpu_profiles=[dump],
                              sim_seed=0, state_dir=None, sim_json=True, bus=None, metrics_listen=None)
    assert runner.run_simulated(None, args, out=io.StringIO()) == 2
    assert capsys.readouterr().err == ("aithermd run --simulate: error: d.txt: no default power limit in "
                                       "the profile\n")
