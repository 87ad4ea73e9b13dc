"""GPU profiles shipped with aithermd, and loading profiles from dumps or JSON.

The shipped profiles are real ``nvidia-smi -q`` dumps kept verbatim as package data under
``aithermd/data/gpu-profiles/`` (origins: the project's realdata ``SOURCES.md``); each slug names one GPU of
one dump. :func:`profile_to_dict` / :func:`profile_from_dict` give the JSON form the fake NVML's state file
and distilled profiles use.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aithermd.sim.gpu_profile import GpuProcessInfo, GpuProfile, GpuSnapshot
from aithermd.sim.smi_dump import DumpError, load_dump, parse_dump

# slug → (dump file under aithermd/data/gpu-profiles, index of the GPU in that dump)
SHIPPED: Mapping[str, tuple[str, int]] = MappingProxyType({
    "rtx4090": ("rtx4090-nvidia-smi-q-x-driver535.xml", 0),
    "rtx4080-super": ("rtx4080super-nvidia-smi-q-idle-and-load.txt", 0),
    "rtx5090": ("rtx5090-nvidia-smi-q.txt", 0),
    "rtx3090": ("rtx3090-nvidia-smi-q-x-driver-v13.xml", 0),
    "rtx6000-ada": ("rtx6000-ada-x8-nvidia-smi-q.txt", 0),
    "l40s": ("l40s-nvidia-smi-q-idle-and-load.txt", 0),
    "a100": ("a100-sxm4-80gb-nvidia-smi-q-x.xml", 0),
    "h100": ("h100-80gb-hbm3-nvidia-smi-q-idle-and-load.txt", 0),
    "h200": ("h200-141gb-nvidia-smi-q-idle-and-load.txt", 0),
})

_DATA_PACKAGE = "aithermd"
_DATA_DIR = ("data", "gpu-profiles")


def shipped_profiles() -> dict[str, GpuProfile]:
    """Every shipped profile keyed by slug (``rtx4090``, ``rtx3090``, ``rtx6000-ada``, ``a100``, ``h100``, …),
    parsed from the packaged dumps on each call (a few ms)."""
    base = resources.files(_DATA_PACKAGE).joinpath(*_DATA_DIR)
    out: dict[str, GpuProfile] = {}
    for slug, (fname, index) in SHIPPED.items():
        text = base.joinpath(fname).read_text(encoding="utf-8")
        out[slug] = parse_dump(text, source=fname)[index]
    return out


def _norm(name: str) -> str:
    name = re.sub(r"\b(nvidia|geforce)\b", "", name.lower())
    return re.sub(r"[^0-9a-z]+", "", name)


def find_profile(name_or_slug: str) -> GpuProfile | None:
    """The shipped profile for a slug (``"rtx4090"``) or product name (``"NVIDIA GeForce RTX 4090"``,
    ``"A100"``, ``"RTX 6000 Ada"``), or None when no shipped profile fits.

    Matching, first hit wins: the slug exactly; the name equal to a slug or a profile's product name once
    "NVIDIA"/"GeForce", case, spaces and punctuation are dropped; a profile's product name starting with it.
    """
    profiles = shipped_profiles()
    if name_or_slug.strip().lower() in profiles:
        return profiles[name_or_slug.strip().lower()]
    q = _norm(name_or_slug)
    if not q:
        return None
    for slug, prof in profiles.items():
        if q in (_norm(slug), _norm(prof.name)):
            return prof
    for prof in profiles.values():
        if _norm(prof.name).startswith(q):
            return prof
    return None


def load_profiles(paths: Iterable[str | Path]) -> list[GpuProfile]:
    """Every GPU of every file, in order: ``nvidia-smi -q`` dumps (text or XML) or JSON written by
    :func:`profiles_to_json` (a list of profile objects, or one). Raises
    :class:`~aithermd.sim.smi_dump.DumpError` for an unreadable or invalid file."""
    out: list[GpuProfile] = []
    for path in paths:
        p = Path(path)
        if p.suffix == ".json":
            try:
                data = json.loads(p.read_text(encoding="utf-8"))
                items = data if isinstance(data, list) else [data]
                out.extend(profile_from_dict(d) for d in items)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise DumpError(str(p), f"not a GPU profile JSON file: {exc}") from exc
        else:
            out.extend(load_dump(p))
    return out


def profile_to_dict(profile: GpuProfile) -> dict[str, Any]:
    """A JSON-able dict of every field (snapshots as a list of dicts)."""
    return dataclasses.asdict(profile)


def profile_from_dict(data: Mapping[str, Any]) -> GpuProfile:
    """The inverse of :func:`profile_to_dict`; unknown keys are ignored, missing ones take defaults.
    Raises KeyError when ``name`` or ``pci_bus_id`` is missing."""
    names = {f.name for f in dataclasses.fields(GpuProfile)}
    kw = {k: v for k, v in data.items() if k in names}
    kw["name"], kw["pci_bus_id"] = data["name"], data["pci_bus_id"]
    kw["fan_speeds_pct"] = tuple(kw.get("fan_speeds_pct") or ())
    kw["clock_event_reasons"] = tuple(kw.get("clock_event_reasons") or ())
    kw["extra"] = dict(kw.get("extra") or {})
    snap_names = {f.name for f in dataclasses.fields(GpuSnapshot)}
    kw["snapshots"] = tuple(
        GpuSnapshot(**{**{k: v for k, v in s.items() if k in snap_names},
                       "clock_event_reasons": tuple(s.get("clock_event_reasons") or ()),
                       "processes": _processes(s.get("processes"))})
        for s in kw.get("snapshots") or ())
    kw["processes"] = _processes(kw.get("processes"))
    return GpuProfile(**kw)


def _processes(items: Any) -> tuple[GpuProcessInfo, ...]:
    names = {f.name for f in dataclasses.fields(GpuProcessInfo)}
    return tuple(GpuProcessInfo(**{k: v for k, v in p.items() if k in names}) for p in items or ())


def profiles_to_json(profiles: Iterable[GpuProfile]) -> str:
    """JSON text of a list of profiles, readable back by :func:`load_profiles`."""
    return json.dumps([profile_to_dict(p) for p in profiles], indent=1)
