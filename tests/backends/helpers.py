"""Shared helpers for the sysfs backend tests: fixture locations and the lm-sensors reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MACHINES_DIR = FIXTURES / "sysfs"
TTAR = FIXTURES / "ttar"
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


def assert_agrees(view: dict, reference: dict) -> None:
    assert sorted(view) == sorted(reference), "chips differ from lm-sensors"
    for chip, feats in reference.items():
        ours = view[chip]
        assert sorted(ours) == sorted(feats), f"{chip}: labels differ"
        for label, (attribute, value) in feats.items():
            got_attr, got = ours[label]
            assert got_attr == attribute, f"{chip} {label}: attribute {got_attr} != {attribute}"
            assert got is not None and abs(got - value) <= TOLERANCE, f"{chip} {label}: {got} != {value}"


def copy_machine(machine: str, dest: Path) -> Path:
    """A writable copy of ``machine``'s ``sys/`` tree (symlinks kept); returns the copied root."""
    root = dest / "sys"
    shutil.copytree(MACHINES_DIR / machine / "sys", root, symlinks=True)
    return root
