"""Shipped GPU profiles, name lookup and the JSON form."""

from pathlib import Path

import pytest

from aithermd.sim.profiles import (
    find_profile,
    load_profiles,
    profile_from_dict,
    profile_to_dict,
    profiles_to_json,
    shipped_profiles,
)
from aithermd.sim.smi_dump import DumpError

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi-q"


def test_shipped_profiles_cover_the_workstation_and_datacenter_gpus():
    p = shipped_profiles()
    assert {"rtx4090", "rtx3090", "rtx6000-ada", "a100", "h100"} <= set(p)
    assert p["rtx4090"].name == "NVIDIA GeForce RTX 4090"
    assert (p["rtx4090"].default_power_limit_w, p["rtx4090"].max_power_limit_w) == (450, 600)
    assert (p["rtx3090"].min_power_limit_w, p["rtx3090"].max_power_limit_w) == (100, 480)
    assert p["rtx6000-ada"].name == "NVIDIA RTX 6000 Ada Generation"
    assert p["a100"].max_power_limit_w == 500 and p["h100"].max_power_limit_w == 700
    assert [s.label for s in p["h100"].snapshots] == ["idle", "load"]


@pytest.mark.parametrize(("query", "slug"), [
    ("rtx4090", "rtx4090"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("RTX 6000 Ada", "rtx6000-ada"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"), ("A100", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("H100", "h100"), ("geforce rtx 3090", "rtx3090"),
])
def test_find_profile_by_slug_or_product_name(query, slug):
    assert find_profile(query) == shipped_profiles()[slug]


@pytest.mark.parametrize("query", ["NVIDIA H100 NVL", "RTX 3090 Ti", "", "Radeon RX 7900 XTX"])
def test_find_profile_refuses_a_near_miss(query):
    assert find_profile(query) is None


def test_json_round_trip_and_load_profiles(tmp_path):
    p = shipped_profiles()["h200"]
    assert profile_from_dict(profile_to_dict(p)) == p
    f = tmp_path / "gpus.json"
    f.write_text(profiles_to_json([p, shipped_profiles()["a100"]]))
    got = load_profiles([f, DUMPS / "rtx4060ti-x2-nvidia-smi-q.txt"])
    assert [g.name for g in got] == ["NVIDIA H200", "NVIDIA A100-SXM4-80GB",
                                     "NVIDIA GeForce RTX 4060 Ti", "NVIDIA GeForce RTX 4060 Ti"]
    assert got[0] == p
    bad = tmp_path / "bad.json"
    bad.write_text('{"nope": 1}')
    with pytest.raises(DumpError, match="bad.json"):
        load_profiles([bad])
