"""Views of the ``GetSnapshot`` document for people: GPU cards, CPU packages, board fans.

The document is :class:`aithermd.publish.wire.SnapshotDoc` (the daemon's own type; the client checks every
document against it): the ``aithermd sensors --json`` shape plus per channel ``thresholds`` (when the source
states any: the GPU card's slowdown temperature), per knob ``mode`` and this tick's ``requested``,
``reason``, ``rule``, ``layer``, per device ``attrs`` (GPU ``clock_event_reasons``), and a ``"policy":
{"active", "holds", "states"}`` object. Members that may be absent (``chip``, ``attrs``, ``thresholds``) are
read with ``.get``. Pure functions, no I/O, shared by the CLI text output and the TUI widgets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from aithermd.publish.wire import ChannelDoc, DeviceDoc, KnobDoc, PolicyDoc, SnapshotDoc

Doc = Mapping[str, Any]  # any member of a document
_RULE = re.compile(r"^([\w.-]+/[\w.-]+):\s*")
_CPU_CHIPS = ("coretemp", "k10temp", "zenpower")


class FanDuty(NamedTuple):
    id: str
    pct: float | None


class GpuView(NamedTuple):
    """One GPU card: °C, W, %; ``rule`` set the power limit (``""`` when none), ``reason`` why."""

    id: str
    name: str
    temp_c: float | None
    slowdown_c: float | None
    power_w: float | None
    limit_w: float | None
    limit_min_w: float | None
    limit_max_w: float | None
    default_w: float | None
    util_pct: float | None
    fans: tuple[FanDuty, ...]
    reasons: tuple[str, ...]
    rule: str
    reason: str
    problems: tuple[str, ...]
    held_idle: Mapping[str, Any] | None = None  # held high while idle (the daemon's attrs["held_idle"])


class CpuPackageView(NamedTuple):
    """A RAPL package zone: power against PL1 (long term) and PL2 (short term), W; package temperature."""

    id: str
    name: str
    power_w: float | None
    pl1_w: float | None
    pl2_w: float | None
    temp_c: float | None
    rule: str


class BoardFanView(NamedTuple):
    """A fan (a board fan input, or a GPU's own fan): speed (RPM), the duty of the pwm or fan knob that
    drives it (%), what drives it, its status (``ok``, a reading's status, or an alarm: ``stalled``,
    ``empty``, ``blind``, ``conflict``, ``uncontrollable``) and what calibration found (start and stop
    duty, %)."""

    id: str
    label: str
    rpm: float | None
    duty_pct: float | None
    knob_id: str | None
    source: str
    status: str
    alarm: str = ""
    start_pct: float | None = None
    stop_pct: float | None = None


class Overview(NamedTuple):
    gpus: tuple[GpuView, ...]
    packages: tuple[CpuPackageView, ...]
    fans: tuple[BoardFanView, ...]
    active_policy: str
    holds: tuple[Mapping[str, Any], ...]
    states: Mapping[str, Mapping[str, str]]
    degraded: tuple[str, ...]
    dry_run: bool


def channels(device: DeviceDoc) -> dict[str, ChannelDoc]:
    """A device's channels by ``attribute``."""
    return {c.get("attribute") or c["id"].rsplit("/", 1)[-1]: c for c in device.get("channels") or ()}


def knobs(device: DeviceDoc) -> dict[str, KnobDoc]:
    """A device's knobs by name (the part of the id after the device)."""
    return {k["id"].rsplit("/", 1)[-1]: k for k in device.get("knobs") or ()}


def all_knobs(doc: SnapshotDoc) -> dict[str, KnobDoc]:
    """Every knob of the document by id, in document order."""
    return {k["id"]: k for d in doc.get("devices") or () for k in d.get("knobs") or ()}


def value(entry: ChannelDoc | KnobDoc | None) -> float | None:
    """A channel's or knob's numeric value, None when absent, null or not a number."""
    if not entry:
        return None
    v = entry.get("value")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def rule_of(knob: KnobDoc | None) -> str:
    """The rule that set a knob: its ``rule`` member, else the ``policy/rule`` prefix of its ``reason``."""
    if not knob:
        return ""
    if knob.get("rule"):
        return str(knob["rule"])
    match = _RULE.match(str(knob.get("reason") or ""))
    return match.group(1) if match else ""


def reason_of(knob: KnobDoc | None) -> str:
    """A knob's reason without the ``policy/rule:`` prefix."""
    return _RULE.sub("", str((knob or {}).get("reason") or ""), count=1)


def _problems(device: DeviceDoc) -> tuple[str, ...]:
    return tuple(f"{c.get('label') or c.get('attribute')}: {c.get('status')}"
                 for c in device.get("channels") or ()
                 if c.get("status") not in (None, "ok", "not_supported"))


def gpu_view(device: DeviceDoc) -> GpuView:
    chans, kn = channels(device), knobs(device)
    limit = kn.get("power_limit")
    temp = chans.get("temperature")
    fans = tuple(FanDuty(k["id"], value(chans.get(name)) if name in chans else value(k))
                 for name, k in kn.items() if k.get("kind") == "fan")
    if not fans:
        fans = tuple(FanDuty(c["id"], value(c)) for n, c in chans.items() if re.fullmatch(r"fan\d+", n))
    attrs = device.get("attrs") or {}
    return GpuView(
        id=device["id"], name=str(device.get("name") or device["id"]),
        temp_c=value(temp), slowdown_c=((temp or {}).get("thresholds") or {}).get("slowdown"),
        power_w=value(chans.get("power")), limit_w=value(limit),
        limit_min_w=(limit or {}).get("min"), limit_max_w=(limit or {}).get("max"),
        default_w=(limit or {}).get("default"), util_pct=value(chans.get("utilization")), fans=fans,
        reasons=tuple(str(r) for r in attrs.get("clock_event_reasons") or ()),
        rule=rule_of(limit), reason=reason_of(limit), problems=_problems(device),
        held_idle=attrs.get("held_idle") if isinstance(attrs.get("held_idle"), Mapping) else None)


def _package_temp(doc: SnapshotDoc, zone: str) -> float | None:
    index = zone.split("-", 1)[1] if zone.startswith("package-") else "0"
    best: float | None = None
    for device in doc.get("devices") or ():
        if device.get("kind") != "hwmon" or not str(device.get("chip") or "").startswith(_CPU_CHIPS):
            continue
        for c in device.get("channels") or ():
            label = str(c.get("label") or "")
            if c.get("unit") != "°C":
                continue
            if label == f"Package id {index}":
                return value(c)
            if best is None and label in ("Tctl", "Tdie") and index == "0":
                best = value(c)
    return best


def cpu_packages(doc: SnapshotDoc) -> tuple[CpuPackageView, ...]:
    out = []
    platform = []
    for device in doc.get("devices") or ():
        name = str(device.get("name") or "")
        if device.get("kind") != "powercap" or device.get("duplicate_of"):  # an MMIO copy: shown once
            continue
        if name == "psys":  # the platform (package and the rest of the SoC): shown apart, after the packages
            platform.append(CpuPackageView(id=device["id"], name="psys", power_w=value(channels(device).get(
                "power")), pl1_w=value(knobs(device).get("pl1")), pl2_w=value(knobs(device).get("pl2")),
                temp_c=None, rule="platform, not a package"))
            continue
        if not name.startswith("package"):
            continue
        chans, kn = channels(device), knobs(device)
        out.append(CpuPackageView(
            id=device["id"], name=name, power_w=value(chans.get("power")), pl1_w=value(kn.get("pl1")),
            pl2_w=value(kn.get("pl2")), temp_c=_package_temp(doc, name),
            rule=rule_of(kn.get("pl1")) or rule_of(kn.get("pl2"))))
    return tuple(out + platform)


def _fan_source(knob: KnobDoc | None) -> str:
    if knob is None:
        return "firmware (no pwm)"
    rule = rule_of(knob)
    if rule:
        return rule
    if knob.get("reason"):
        return str(knob["reason"])
    if not knob.get("writable", True):
        return "firmware (read-only)"
    return "firmware"


def board_fans(doc: SnapshotDoc) -> tuple[BoardFanView, ...]:
    """Every fan: each hwmon fan input with the pwm that drives it (as fan detection found, else ``fanN``
    with ``pwmN``, the kernel's numbering convention), each pwm that detection found drives nothing (an
    empty header), then each GPU's own fans, alike."""
    alarms: Mapping[str, Doc] = doc.get("alarms") or {}
    out = []
    for device in doc.get("devices") or ():
        if device.get("kind") == "gpu":
            out += _gpu_fans(device, alarms)
            continue
        if device.get("kind") != "hwmon":
            continue
        kn = knobs(device)
        chip = device.get("chip") or device["id"]
        driver: dict[str, Doc] = {}
        for name, k in kn.items():
            if k.get("kind") != "pwm":
                continue
            fan = k.get("fan")
            paired = [f"{device['id']}/fan{name[3:]}"] if fan is None else []
            for tach in (fan or {}).get("tachs") or paired:
                driver.setdefault(tach, k)
        for attr, c in channels(device).items():
            if not re.fullmatch(r"fan\d+", attr) or c.get("unit") != "RPM":
                continue
            out.append(_fan_view(c["id"], f"{chip} {c.get('label') or attr}", value(c), driver.get(c["id"]),
                                 str(c.get("status") or "ok"), alarms))
        for name, k in kn.items():
            fan = k.get("fan")
            if k.get("kind") == "pwm" and fan is not None and not fan.get("tachs"):
                out.append(_fan_view(k["id"], f"{chip} {k.get('label') or name}", None, k, "ok", alarms))
    return tuple(out)


def _fan_view(fan_id: str, label: str, rpm: float | None, knob: KnobDoc | None, status: str,
              alarms: Mapping[str, Doc]) -> BoardFanView:
    alarm = alarms.get(fan_id) or (alarms.get(knob["id"]) if knob else None) or {}
    fan = (knob or {}).get("fan") or {}
    return BoardFanView(
        id=fan_id, label=label, rpm=rpm, duty_pct=value(knob), knob_id=knob["id"] if knob else None,
        source=_fan_source(knob), status=str(alarm.get("kind") or status),
        alarm=str(alarm.get("message") or ""),
        start_pct=fan.get("start_pct"), stop_pct=fan.get("stop_pct"))


def _gpu_fans(device: DeviceDoc, alarms: Mapping[str, Doc]) -> list[BoardFanView]:
    chans = channels(device)
    out = []
    for name, k in knobs(device).items():
        if k.get("kind") != "fan":
            continue
        speed = chans.get(name)
        duty = value(speed) if speed is not None else value(k)
        view = _fan_view(k["id"], f"{device['id']} {k.get('label') or name}", None, k,
                         str((speed or {}).get("status") or "ok"), alarms)
        out.append(view._replace(duty_pct=duty))
    return out


def overview(doc: SnapshotDoc) -> Overview:
    policy = doc.get("policy") or {}
    return Overview(
        gpus=tuple(gpu_view(d) for d in doc.get("devices") or () if d.get("kind") == "gpu"),
        packages=cpu_packages(doc), fans=board_fans(doc),
        active_policy=str(policy.get("active") or ""), holds=tuple(policy.get("holds") or ()),
        states=policy.get("states") or {}, degraded=tuple(doc.get("degraded") or ()),
        dry_run=bool(doc.get("dry_run")))


def fmt(v: float | None, unit: str = "", digits: int = 0) -> str:
    """``fmt(71.04, "°C")`` → ``"71 °C"``; None → ``"—"``."""
    if v is None:
        return "—"
    text = f"{v:.{digits}f}"
    return f"{text} {unit}" if unit and unit != "%" else f"{text}{unit}"


def effective_policy(policy: PolicyDoc) -> str:
    """The policy in force: the last hold's, else the active one."""
    holds = policy.get("holds") or ()
    return str(holds[-1].get("policy")) if holds else str(policy.get("active") or "")
