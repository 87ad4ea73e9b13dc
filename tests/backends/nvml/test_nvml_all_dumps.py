"""Every recorded dump becomes fake GPUs that the NVML backend discovers with the dump's own limits."""

from __future__ import annotations

import pytest

from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.smi_dump import load_dump
from tests.backends.nvml.conftest import DUMPS

ALL = sorted(p.name for p in DUMPS.iterdir())


def test_there_are_37_dumps():
    assert len(ALL) == 37


@pytest.mark.parametrize("fname", ALL)
def test_backend_over_each_dump(fname, backend_over):
    profiles = load_dump(DUMPS / fname)
    backend = backend_over(FakeNvml(profiles))
    devices = backend.discover()
    assert [d.id for d in devices] == [f"gpu{i}" for i in range(len(profiles))]
    assert [d.info["pci_bus_id"] for d in devices] == [p.pci_bus_id for p in profiles]
    assert len({d.info["uuid"] for d in devices}) == len(devices), "masked UUIDs become unique ones"
    sample = backend.sample()
    assert sample.lost == frozenset()
    for dev, prof in zip(devices, profiles, strict=True):
        knobs = {k.id.split("/")[1]: k for k in dev.knobs}
        limit = knobs["power_limit"]
        assert (limit.min, limit.max, limit.default) == (
            prof.min_power_limit_w,
            prof.max_power_limit_w,
            prof.default_power_limit_w,
        )
        assert limit.writable
        assert sample.knobs[limit.id].value == prof.power_limit_w
        channels = {c.attribute: c for c in dev.channels}
        if prof.temp_c is None:
            assert "temperature" not in channels
        else:
            assert sample.readings[f"{dev.id}/temperature"].value == round(prof.temp_c)
            expected = {
                k: v
                for k, v in (
                    ("slowdown", prof.slowdown_temp_c),
                    ("shutdown", prof.shutdown_temp_c),
                    ("max_operating", prof.max_operating_temp_c),
                )
                if v is not None
            }
            assert dict(channels["temperature"].thresholds) == expected
        assert ("memory_temperature" in channels) == (prof.memory_temp_c is not None)
        assert len([k for k in knobs if k.startswith("fan")]) == len(prof.fan_speeds_pct)
        if prof.power_draw_w is not None:
            assert sample.readings[f"{dev.id}/power"].value == pytest.approx(prof.power_draw_w)
