"""Selectors: which GPUs, RAPL zones, fans and temperature channels a policy names, on a given machine.

Patterns are fnmatch globs; ids match case-sensitively, names, labels and UUIDs case-insensitively.
Ids follow :mod:`aithermd.model`: ``gpu<N>``, ``powercap:<zone>``, ``hwmon:<chip>/<attribute>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, Quantity
from aithermd.policy.kinds import FanMatch, GpuMatch

FAN_KINDS = (KnobKind.PWM, KnobKind.FAN)


def _any(value: str | None, patterns: Iterable[str], *, fold: bool = False) -> bool:
    if value is None:
        return False
    if fold:
        value = value.lower()
        return any(fnmatchcase(value, p.lower()) for p in patterns)
    return any(fnmatchcase(value, p) for p in patterns)


def gpu_index(device: Device) -> int | None:
    """The NVML index of ``gpu<N>`` (None for other ids, or a ``#2`` suffix)."""
    tail = device.id[3:] if device.id.startswith("gpu") else ""
    return int(tail) if tail.isdigit() else None


def gpus(devices: Sequence[Device]) -> list[Device]:
    """Every GPU, by index order."""
    found = [d for d in devices if d.kind == DeviceKind.GPU]
    return sorted(found, key=lambda d: (gpu_index(d) is None, gpu_index(d) or 0, d.id))


def select_gpus(match: GpuMatch, devices: Sequence[Device]) -> list[Device]:
    """GPUs matching every key given in ``match`` (all GPUs when none is given)."""
    out = []
    for d in gpus(devices):
        if match.index is not None and gpu_index(d) not in match.index:
            continue
        if match.uuid is not None and not _any(str(d.info.get("uuid", "")), match.uuid, fold=True):
            continue
        if match.model is not None and not _any(d.name, match.model, fold=True):
            continue
        out.append(d)
    return out


def zone_name(device: Device) -> str:
    return device.id.split(":", 1)[1] if ":" in device.id else device.id


def select_zones(patterns: Sequence[str], devices: Sequence[Device]) -> list[Device]:
    """RAPL zones (powercap devices) whose zone name or device id matches."""
    return [d for d in devices if d.kind == DeviceKind.POWERCAP
            and (_any(zone_name(d), patterns) or _any(d.id, patterns))]


def channel_map(devices: Sequence[Device]) -> dict[str, Channel]:
    return {c.id: c for d in devices for c in d.channels}


def select_fans(match: FanMatch, devices: Sequence[Device]) -> list[Knob]:
    """Fan knobs (hwmon ``pwmN``, GPU ``fanN``) matching every key given in ``match``."""
    channels = channel_map(devices)
    out = []
    for d in devices:
        chip = d.chip or (d.id.split(":", 1)[1] if d.id.startswith("hwmon:") else None)
        for k in d.knobs:
            if k.kind not in FAN_KINDS:
                continue
            if match.id is not None and not _any(k.id, match.id):
                continue
            if match.chip is not None and not (_any(chip, match.chip) or _any(d.id, match.chip)):
                continue
            if match.label is not None:  # the admin's name for the fan, or its fan channel's label
                ch = channels.get(k.fan_channel or "")
                names = (k.label, *((ch.label, ch.alias) if ch is not None else ()))
                if not any(_any(n, match.label, fold=True) for n in names):
                    continue
            out.append(k)
    return out


def select_temperatures(patterns: Sequence[str], devices: Sequence[Device]) -> list[Channel]:
    """Temperature channels whose id matches a pattern, or whose label or documented alias (``Tctl`` for
    an unlabelled k10temp ``temp1``) matches one (case-insensitive)."""
    return [c for d in devices for c in d.channels
            if c.quantity == Quantity.TEMPERATURE
            and (_any(c.id, patterns) or _any(c.label, patterns, fold=True)
                 or _any(c.alias, patterns, fold=True))]


def knob_of(device: Device, kind: KnobKind) -> Knob | None:
    return next((k for k in device.knobs if k.kind == kind), None)
