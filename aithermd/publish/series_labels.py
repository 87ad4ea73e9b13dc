"""Label values of the exporter's hwmon series, made once per device object: node_exporter's chip name
(:func:`node_exporter_chip`) and each device's rows in the hwmon families (:func:`hwmon_rows`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from aithermd.model import Device, DeviceKind, KnobKind, Quantity

# hwmon series: the lm-sensors chip name (with #2 for a twin), node_exporter's hwmon chip name (``node_chip``,
# its ``chip`` label: bus type and device, e.g. platform_nct6775_656) and sensor (tempN, fanN, the same in
# both), the label or else the sensor name.
HWMON_LABELS = ["chip", "node_chip", "sensor", "label"]
_NODE_CHIP_INVALID = re.compile(r"[^a-z0-9:_]")
_node_chips: dict[int, tuple[Device, Any]] = {}
_rows: dict[int, tuple[Device, Any]] = {}


def node_exporter_chip(dev: Device) -> str:
    """node_exporter's hwmon ``chip`` label for ``dev`` (collector/hwmon_linux.go, hwmonName): the device's
    bus directory and name, each lower-cased with characters outside ``[a-z0-9:_]`` made ``_``
    (``devices/platform/nct6775.656`` → ``platform_nct6775_656``); for a chip with no device link, its
    name. Kept per device object (a scrape asks for each chip's twice)."""
    return _kept(_node_chips, dev, _node_chip)


def _kept(cache: dict[int, tuple[Device, Any]], dev: Device, make: Callable[[Device], Any]) -> Any:
    """``make(dev)``, kept while ``dev`` is the same object (devices are frozen; a hotplug or reload
    replaces them); at most 1024 kept."""
    kept = cache.get(id(dev))
    if kept is not None and kept[0] is dev:
        return kept[1]
    if len(cache) > 1024:
        cache.clear()
    value = make(dev)
    cache[id(dev)] = (dev, value)
    return value


_Row = tuple[int, str, tuple[str, ...]]


def hwmon_rows(dev: Device) -> tuple[list[_Row], list[tuple[str, tuple[str, ...]]]]:
    """:func:`_hwmon_rows`, kept per device object."""
    return _kept(_rows, dev, _hwmon_rows)


def _hwmon_rows(dev: Device) -> tuple[list[_Row], list[tuple[str, tuple[str, ...]]]]:
    """The series of one device in the hwmon families: (family 0 temperature, 1 thermal zone, 2 fan speed;
    channel id; label values) and the fan duties (knob id; label values)."""
    hwmon = dev.kind is DeviceKind.HWMON
    # the unique id's chip part: twin chips (two acpitz-acpi-0) are chip and chip#2, so Prometheus never sees
    # two series with the same labels
    chip = dev.id.removeprefix("hwmon:") if hwmon else dev.id
    node_chip = node_exporter_chip(dev) if hwmon else ""
    rows: list[_Row] = []
    for ch in dev.channels:
        if hwmon and ch.quantity in (Quantity.TEMPERATURE, Quantity.FAN):
            rows.append((0 if ch.quantity is Quantity.TEMPERATURE else 2, ch.id,
                         (chip, node_chip, ch.attribute, ch.label or ch.attribute)))
        elif dev.kind is DeviceKind.THERMAL:
            rows.append((1, ch.id, (dev.id.removeprefix("thermal:"), dev.name)))
    channels = {ch.id: ch for ch in dev.channels}
    duties = []
    for knob in dev.knobs:
        if knob.kind in (KnobKind.PWM, KnobKind.FAN):
            # the fan's own labels (chip, node_chip, sensor fanN, label), so duty and RPM join on them
            fan = channels.get(knob.fan_channel or "")
            sensor = fan.attribute if fan is not None else knob.id.rsplit("/", 1)[-1]
            label = knob.label or (fan.label if fan is not None else None) or sensor
            duties.append((knob.id, (knob.id, chip, node_chip, sensor, label)))
    return rows, duties


def _node_chip(dev: Device) -> str:
    def clean(text: str) -> str:
        return _NODE_CHIP_INVALID.sub("_", text.strip().lower()).strip("_")

    parts = str(dev.info.get("bus_path", "")).split("/")
    if len(parts) >= 2 and not parts[-1].startswith("hwmon") and parts[:2] != ["devices", "virtual"]:
        kind, name = clean(parts[-2]), clean(parts[-1])
        if kind and name:
            return f"{kind}_{name}"
    return clean(dev.name)
