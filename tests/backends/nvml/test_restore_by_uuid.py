"""A journaled original goes back to the board it was saved from, even when NVML renumbers the GPUs."""

from __future__ import annotations

import pytest

from aithermd.backends.nvml import NvmlBackend
from aithermd.errors import UnknownKnob
from aithermd.sim.fake_nvml import FakeNvml

from .conftest import H100, RTX4090, profile


def test_after_a_gpu_vanishes_the_original_goes_back_to_the_right_board(tmp_path):
    state = tmp_path / "nvml.json"
    fake = FakeNvml([profile(RTX4090), profile(H100)], state_path=state)
    before = NvmlBackend(nvml=fake.bindings())
    before.discover()
    saved_4090 = before.save_knob("gpu0/power_limit")
    saved_h100 = before.save_knob("gpu1/power_limit")
    before.write_knob("gpu0/power_limit", 300.0)
    before.write_knob("gpu1/power_limit", 500.0)
    before.close()

    fake.remove_gpu(0)  # the RTX 4090 fell off the bus; after restart the H100 is NVML index 0
    after = NvmlBackend(nvml=FakeNvml.open(state).bindings())
    [h100] = after.discover()
    assert h100.id == "gpu0" and h100.name == "NVIDIA H100 80GB HBM3"

    after.restore_knob("gpu1/power_limit", saved_h100)  # the journal still says gpu1: the UUID finds it
    assert after.read_knob("gpu0/power_limit").value == pytest.approx(saved_h100["limit_mw"] / 1000)
    with pytest.raises(UnknownKnob, match="not here"):
        after.restore_knob("gpu0/power_limit", saved_4090)  # never the 4090's 450 W onto the H100
    assert after.read_knob("gpu0/power_limit").value == pytest.approx(saved_h100["limit_mw"] / 1000)
    after.close()


def test_an_original_without_a_uuid_still_restores_by_index(tmp_path):
    fake = FakeNvml([profile(RTX4090)])
    backend = NvmlBackend(nvml=fake.bindings())
    backend.discover()
    saved = backend.save_knob("gpu0/power_limit")
    backend.write_knob("gpu0/power_limit", 300.0)
    backend.restore_knob("gpu0/power_limit", {"limit_mw": saved["limit_mw"]})  # an older journal
    assert fake.power_limit_w(0) == pytest.approx(saved["limit_mw"] / 1000)
    backend.close()
