"""The ``aithermd sensors`` document: devices, their channels and knobs with this tick's values.

Shape (issue 2, exact)::

    {"devices": [{"id", "kind": "hwmon"|"powercap"|"thermal"|"cpu"|"gpu", "name", "chip" (hwmon only),
                  "channels": [{"id", "attribute", "label", "alias", "value", "unit", "status",
                                "reason"}],
                  "knobs": [{"id", "kind", "value", "unit", "min", "max", "default", "writable",
                             "why_not"}]}]}

``label`` is the channel's label, or its attribute name when it has none (as lm-sensors prints it); a
derived channel also has ``"estimated": true`` (a pre-Volta GPU's energy, integrated from its power);
``alias`` the name its driver documents for it when the label lacks it (``Tctl``), else None;
``value`` is a number in the channel's unit, or None with a non-ok ``status``. ``status`` is the reading's
(``ok``, ``failed``, ``implausible``, ``stale``, ``not_supported``) or ``held`` when the daemon's sensor
trust carries the last good value over a suspect reading (:mod:`aithermd.backends.trust`); ``reason`` says
why whenever the status is not ``ok`` (``"EIO: Input/output error"``, ``"sentinel 127 °C (a saturated
register)"``), else None. Knob values are in daemon
units (duty %, W). A plain function of the model types, so D-Bus ``GetSnapshot`` can extend it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from aithermd.model import HELD, Channel, Device, DeviceKind, Knob, KnobValue, Reading, Status

HELD_STATUS = "held"


def _number(value: float | None) -> float | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def channel_entry(channel: Channel, reading: Reading | None) -> dict[str, Any]:
    """One channel: no reading this tick reads as ``stale``."""
    if reading is None:
        status, reason = str(Status.STALE), "no reading"
    elif reading.status is Status.OK and reading.detail and reading.detail.startswith(HELD):
        status, reason = HELD_STATUS, reading.detail[len(HELD):]
    else:
        status, reason = str(reading.status), reading.detail
    entry = {
        "id": channel.id,
        "attribute": channel.attribute,
        "label": channel.label if channel.label is not None else channel.attribute,
        "alias": channel.alias,
        "value": _number(reading.value) if reading is not None else None,
        "unit": channel.unit,
        "status": status,
        "reason": reason,
    }
    if channel.estimated:
        entry["estimated"] = True
    return entry


def knob_entry(knob: Knob, value: KnobValue | None) -> dict[str, Any]:
    """A knob's entry; an enumerated one (EPP, governor, boost, platform_profile) adds its ``choices``, the
    value being an index into them."""
    extra = {"choices": list(knob.choices)} if knob.choices else {}
    return {**extra, 
        "id": knob.id,
        "kind": str(knob.kind),
        "value": _number(value.value) if value is not None else None,
        "unit": knob.unit,
        "min": knob.min,
        "max": knob.max,
        "default": knob.default,
        "writable": knob.writable,
        "why_not": knob.why_not,
    }


def device_entry(
    device: Device, readings: Mapping[str, Reading], knobs: Mapping[str, KnobValue]
) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": device.id, "kind": str(device.kind), "name": device.name}
    if device.kind == DeviceKind.HWMON:
        entry["chip"] = device.chip
    entry["channels"] = [channel_entry(c, readings.get(c.id)) for c in device.channels]
    entry["knobs"] = [knob_entry(k, knobs.get(k.id)) for k in device.knobs]
    return entry


def sensors_document(
    devices: Iterable[Device],
    readings: Mapping[str, Reading],
    knobs: Mapping[str, KnobValue],
    attrs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The document for ``devices`` with ``readings`` (by channel id) and ``knobs`` (by knob id).

    ``attrs`` (per-device non-numeric facts, e.g. GPU ``pstate``) are added as a device's ``"attrs"`` only
    when given, so the ``sensors`` output keeps exactly the issue's shape."""
    out = []
    for device in devices:
        entry = device_entry(device, readings, knobs)
        if attrs is not None and device.id in attrs:
            entry["attrs"] = dict(attrs[device.id])
        out.append(entry)
    return {"devices": out}


_DECIMALS = {"RPM": 0, "MHz": 0, "V": 3, "A": 3, "W": 2, "": 2}


def _fmt(value: float | None, unit: str) -> str:
    """``value`` with the decimals lm-sensors shows for ``unit`` (°C, %, J: one)."""
    if value is None:
        return "—"
    return f"{value:.{_DECIMALS.get(unit, 1)}f} {unit}".rstrip()


def render_table(doc: Mapping[str, Any]) -> str:
    """A readable table grouped by device, like ``sensors``: a heading per device, one line per channel
    (label, value, attribute, status when not ok) and per knob (value, range, writable or why not)."""
    lines: list[str] = []
    for dev in doc.get("devices", []):
        lines.append(
            dev["id"] if dev.get("name") in (None, "", dev["id"]) else f"{dev['id']}  ({dev['name']})"
        )
        rows = [
            (
                c["label"] if not c.get("alias") else f"{c['label']} ({c['alias']})",
                _fmt(c["value"], c["unit"]),
                c["attribute"],
                ("" if c["status"] == "ok" else
                 f"[{c['status']}: {c['reason']}]" if c.get("reason") else f"[{c['status']}]")
                + (" (estimated)" if c.get("estimated") else ""),
            )
            for c in dev.get("channels", [])
        ]
        for k in dev.get("knobs", []):
            span, shown = "", _fmt(k["value"], k["unit"])
            if k.get("choices"):
                span = "one of " + "|".join(k["choices"])
                if k["value"] is not None and 0 <= int(k["value"]) < len(k["choices"]):
                    shown = k["choices"][int(k["value"])]
            elif k["min"] is not None or k["max"] is not None:
                low = "?" if k["min"] is None else _fmt(k["min"], k["unit"]).removesuffix(k["unit"]).strip()
                span = f"{low}–{_fmt(k['max'], k['unit']) if k['max'] is not None else '?'}"
            note = (
                "writable" if k["writable"] else f"read-only: {k['why_not']}" if k["why_not"] else "read-only"
            )
            rows.append(
                (
                    k["id"].rsplit("/", 1)[-1],
                    shown,
                    k["kind"],
                    f"{span}  {note}".strip(),
                )
            )
        if rows:
            w0 = max(len(r[0]) for r in rows) + 1
            w1 = max(len(r[1]) for r in rows)
            w2 = max(len(r[2]) for r in rows)
            for label, value, attribute, note in rows:
                lines.append(f"  {label + ':':<{w0}} {value:>{w1}}  {attribute:<{w2}}  {note}".rstrip())
        else:
            lines.append("  (no channels)")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n" if lines else "no devices found\n"
