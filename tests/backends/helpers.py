"""Shared helpers for the sysfs backend tests: the lm-sensors reference of each recorded machine (the
machines themselves, and copies of them, come from :mod:`tests.support.machines`)."""

from __future__ import annotations

import json

from tests.support.machines import MACHINES_DIR, TTAR

__all__ = ["MACHINES", "MACHINES_DIR", "TTAR", "assert_agrees", "document_view", "lm_sensors_reference"]

MACHINES = sorted(p.name for p in MACHINES_DIR.iterdir() if (p / "sensors.json").is_file())
TOLERANCE = 0.0005 + 1e-9  # sensors -j prints three decimals


def lm_sensors_reference(machine: str) -> dict[str, dict[str, tuple[str, float]]]:
    """``{chip: {label: (attribute, value)}}`` from ``sensors.json``: the ``_input`` value of each feature,
    else its ``_average`` (power); features with neither (intrusion) are left out."""
    raw = json.loads((MACHINES_DIR / machine / "sensors.json").read_text())
    out: dict[str, dict[str, tuple[str, float]]] = {}
    for chip, features in raw.items():
        feats: dict[str, tuple[str, float]] = {}
        for label, subs in features.items():
            if not isinstance(subs, dict):
                continue
            for suffix in ("_input", "_average"):
                hit = [(k, v) for k, v in subs.items() if k.endswith(suffix)]
                if hit:
                    key, value = hit[0]
                    feats[label] = (key[: -len(suffix)], float(value))
                    break
        out[chip] = feats
    return out


def document_view(doc: dict) -> dict[str, dict[str, tuple[str, float | None]]]:
    """The same view of an aithermd ``sensors`` document (hwmon devices only)."""
    return {
        d["chip"]: {c["label"]: (c["attribute"], c["value"]) for c in d["channels"]}
        for d in doc["devices"]
        if d["kind"] == "hwmon"
    }


# lm-sensors' name of an unlabelled amdgpu feature → the attribute of the gpuN device aithermd makes of it
GPU_FEATURES = {"power1": "power", "fan1": "fan0_rpm"}


def assert_gpus_agree(doc: dict, reference: dict) -> dict:
    """The GPU chips lm-sensors lists (amdgpu, in bus order) are aithermd's hwmon GPUs, in the same order,
    reading the same values; returns ``reference`` without them (for :func:`assert_agrees`)."""
    gpu_chips = sorted(c for c in reference if c.split("-", 1)[0] in ("amdgpu", "xe", "i915"))
    gpus = [d for d in doc["devices"] if d["kind"] == "gpu"]
    assert len(gpus) == len(gpu_chips)
    for chip, dev in zip(gpu_chips, gpus, strict=True):
        ours = {c["attribute"]: c["value"] for c in dev["channels"]}
        labelled = {c["label"]: c["value"] for c in dev["channels"] if c["label"]}
        for label, (_attribute, value) in reference[chip].items():
            got = labelled[label] if label in labelled else ours[GPU_FEATURES[label]]
            assert got is not None and abs(got - value) <= TOLERANCE, f"{chip} {label}: {got} != {value}"
    return {c: f for c, f in reference.items() if c not in gpu_chips}


def assert_agrees(view: dict, reference: dict) -> None:
    assert sorted(view) == sorted(reference), "chips differ from lm-sensors"
    for chip, feats in reference.items():
        ours = view[chip]
        assert sorted(ours) == sorted(feats), f"{chip}: labels differ"
        for label, (attribute, value) in feats.items():
            got_attr, got = ours[label]
            assert got_attr == attribute, f"{chip} {label}: attribute {got_attr} != {attribute}"
            assert got is not None and abs(got - value) <= TOLERANCE, f"{chip} {label}: {got} != {value}"

