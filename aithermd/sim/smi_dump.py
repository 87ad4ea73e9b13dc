"""Parse ``nvidia-smi -q`` dumps, text and ``-x`` XML, into :class:`~aithermd.sim.gpu_profile.GpuProfile`.

Source of the facts: the ``nvidia-smi -q`` output format (``nvidia-smi(1)``, ``nvsmi_device_v11..v13.dtd``)
as real drivers print it, 418 to 610:

- power: ``Power Readings`` (driver < 530: ``Power Limit`` is the management limit, ``Enforced Power
  Limit`` the enforced one) or ``GPU Power Readings`` (≥ 530: ``Requested Power Limit`` is the management
  limit, ``Current Power Limit`` the enforced one; ≥ 610 nests those under ``GPU Ceiling Power Limit``);
  ``Power Draw`` or ``Average``/``Instantaneous Power
  Draw``;
- temperatures: absolute ``GPU Shutdown/Slowdown/Max Operating Temp``, or on Ada/Hopper/Blackwell boards
  margins to T.Limit (``GPU T.Limit Temp`` = T.Limit − current, ``GPU Shutdown T.Limit Temp`` = T.Limit −
  shutdown): those are converted to absolute °C here (shutdown = current + margin − relative threshold);
- several GPUs per dump (one ``GPU <bus id>`` block each), several captures of one GPU (idle then load, or
  ``-d POWER`` then ``-d CLOCK``): captures with the same PCI bus id are merged into one profile, the
  first capture wins, later ones fill what it lacked and are kept as :attr:`GpuProfile.snapshots`;
- "N/A", "[N/A]", "Not Found", "[Not Supported]", "Requested functionality has been deprecated" → None;
  a masked UUID (all zeros) or serial → None; no ``Product Name`` (``-q -d POWER,CLOCK``) → ``""``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aithermd.errors import AithermError
from aithermd.files import read_regular
from aithermd.sim.gpu_profile import GpuProcessInfo, GpuProfile, GpuSnapshot

_NUM = re.compile(r"^[-+]?\d+(?:\.\d+)?")
_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\s*$")
_LABEL = re.compile(r"^#\s*(\w[\w -]*?)\s*::")
_REASON_ALIASES = MappingProxyType({"idle": "gpu_idle", "display_clock_setting": "display_clocks_setting",
                   "user_defined_clocks": "applications_clocks_setting"})
_REASON_SECTIONS = ("clocks_event_reasons/", "clocks_throttle_reasons/")
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


class DumpError(AithermError):
    """A file that is not a readable ``nvidia-smi -q`` dump. ``str()`` is ``PATH[:LINE]: error: message``."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path, self.message, self.line = path, message, line
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: error: {message}")


@dataclass
class _Capture:
    bus_id: str
    label: str
    driver: str | None
    flat: dict[str, str] = field(default_factory=dict)
    processes: list[dict[str, str]] = field(default_factory=list)  # the Processes section, one dict each


def load_dump(path: str | Path) -> list[GpuProfile]:
    """Every GPU of the dump at ``path`` (text or XML), in the dump's order, one profile per PCI bus id.

    Raises :class:`DumpError` when the file cannot be read, is malformed XML, or holds no GPU.
    """
    p = Path(path)
    try:  # a FIFO would block for ever, /dev/zero never end
        raw = read_regular(p)
    except OSError as exc:  # NotRegularFile included: "not a regular file"
        raise DumpError(str(p), f"cannot read: {exc.strerror or exc}") from exc
    return parse_dump(raw.decode("utf-8", errors="replace"), source=p.name, path=str(p))


def parse_dump(text: str, *, source: str = "", path: str | None = None) -> list[GpuProfile]:
    """Like :func:`load_dump` for text already read; ``source`` names it in the profiles and errors."""
    where = path or source or "<dump>"
    if text.lstrip().startswith("<"):
        captures = _xml_captures(text, where)
    else:
        captures = _text_captures(text)
    if not captures:
        raise DumpError(where, "no GPU found: expected the output of `nvidia-smi -q` or `nvidia-smi -q -x`")
    profiles = _merge(captures, source)
    for prof in profiles:
        _check_limits(prof, where)
    return profiles


def _check_limits(prof: GpuProfile, where: str) -> None:
    """Refuse power limits no driver reports (a hand-edited or corrupted dump), which would otherwise reach
    the fake NVML's clamping: every limit > 0 and min ≤ default ≤ max. Raises DumpError."""
    ordered = [v for v in (prof.min_power_limit_w, prof.default_power_limit_w, prof.max_power_limit_w)
               if v is not None]
    if ordered == sorted(ordered) and all(v > 0 for v in [*ordered, prof.power_limit_w or 1.0]):
        return

    def w(v: float | None) -> str:
        return "N/A" if v is None else f"{v:g} W"
    raise DumpError(where, f"GPU {prof.pci_bus_id}: power limits make no sense (min "
                           f"{w(prof.min_power_limit_w)}, default {w(prof.default_power_limit_w)}, max "
                           f"{w(prof.max_power_limit_w)}, limit {w(prof.power_limit_w)}): expected every "
                           "limit > 0 and min ≤ default ≤ max")


def normalize_bus_id(domain: str, bus: str, device: str, function: str) -> str:
    """NVML's bus id spelling: ``00000000:83:00.0`` (8-digit domain, upper-case hex)."""
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function, 16)}"


def _bus_id(text: str) -> str:
    m = re.match(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$", text.strip())
    return normalize_bus_id(*m.groups()) if m else text.strip().upper()


def _key(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")


def _split(stripped: str) -> tuple[str, str | None]:
    i = stripped.find(" : ")
    if i >= 0:
        return _key(stripped[:i]), stripped[i + 3:].strip()
    if stripped.endswith(" :"):
        return _key(stripped[:-2]), ""
    return _key(stripped), None


def _text_captures(text: str) -> list[_Capture]:
    captures: list[_Capture] = []
    label, driver = "", None
    cur: _Capture | None = None
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        line = raw.expandtabs(4).rstrip()
        stripped = line.lstrip()
        if not stripped:
            continue
        indent = len(line) - len(stripped)
        if stripped.startswith("#"):
            cur = None
            m = _LABEL.match(stripped)
            if m:
                label = m.group(1).strip().lower()
            continue
        if stripped.startswith("====="):
            cur = None
            continue
        if indent == 0:
            cur = None
            m = _GPU_HEADER.match(stripped)
            if m:
                cur = _Capture(normalize_bus_id(*m.groups()), label, driver)
                captures.append(cur)
                stack = []
                continue
            key, value = _split(stripped)
            if key in ("driver_version", "kmd_version") and value:
                driver = value.split("[", 1)[0].strip() or driver
            continue
        if cur is None:
            continue
        key, value = _split(stripped)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        fullkey = "/".join([k for _, k in stack] + [key])
        if stack and stack[0][1] == "processes" and value is not None:
            _process_field(cur.processes, key, value)
        elif value is not None:
            cur.flat.setdefault(fullkey, value)
        stack.append((indent, key))
    return captures


_PROCESS_KEYS = MappingProxyType({"process_id": "pid", "pid": "pid", "type": "type", "name": "process_name",
                                  "process_name": "process_name", "used_gpu_memory": "used_memory",
                                  "used_memory": "used_memory", "gpu_instance_id": "gpu_instance_id",
                                  "compute_instance_id": "compute_instance_id"})


def _process_field(entries: list[dict[str, str]], key: str, value: str) -> None:
    """One ``key : value`` line of a text ``Processes`` section: an entry starts at its ``GPU instance ID``
    (drivers ≥ 450) or at a ``Process ID`` when the current entry already has one (older drivers)."""
    name = _PROCESS_KEYS.get(key)
    if name is None:
        return
    if not entries or name in entries[-1] or (name == "gpu_instance_id" and "pid" in entries[-1]):
        entries.append({})
    entries[-1][name] = value


def _xml_captures(text: str, where: str) -> list[_Capture]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise DumpError(where, f"malformed XML: {exc}", line=exc.position[0]) from exc
    driver = (root.findtext("driver_version") or "").strip() or None
    captures = []
    for gpu in root.findall("gpu"):
        cap = _Capture(_bus_id(gpu.get("id", "")), "", driver)
        _flatten(gpu, "", cap.flat)
        for info in gpu.findall("processes/process_info"):
            cap.processes.append({child.tag: " ".join((child.text or "").split()) for child in info})
        captures.append(cap)
    return captures


def _flatten(el: ET.Element, prefix: str, out: dict[str, str]) -> None:
    for child in el:
        path = prefix + child.tag
        if len(child):
            _flatten(child, path + "/", out)
        else:
            out.setdefault(path, " ".join((child.text or "").split()))


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    m = _NUM.match(value.strip())
    return float(m.group(0)) if m else None


def _pick(flat: dict[str, str], *keys: str) -> str | None:
    """The first of ``keys`` with a real value (not N/A, not deprecated, not empty)."""
    for k in keys:
        v = flat.get(k)
        if v is None:
            continue
        v = v.strip()
        if not v or v.strip("[]").lower() in ("n/a", "not found", "not supported", "unknown error") \
                or "deprecated" in v.lower():
            continue
        return v
    return None


def _pnum(flat: dict[str, str], *keys: str) -> float | None:
    for k in keys:
        n = _num(_pick(flat, k))
        if n is not None:
            return n
    return None


def _masked(value: str | None) -> str | None:
    if value is None or not re.sub(r"[0\-]|GPU", "", value):
        return None
    return value


def _reasons(flat: dict[str, str]) -> tuple[str, ...]:
    out = []
    for k, v in flat.items():
        if not k.startswith(_REASON_SECTIONS) or v.strip().lower() != "active":
            continue
        name = k.rsplit("/", 1)[-1]
        for prefix in _REASON_PREFIXES:
            name = name.removeprefix(prefix)
        name = _REASON_ALIASES.get(name, name)
        if name not in out:
            out.append(name)
    return tuple(out)


def _fields(cap: _Capture) -> dict[str, Any]:
    f = cap.flat
    t = "temperature/"
    temp = _pnum(f, t + "gpu_current_temp", t + "gpu_temp")
    margin = _pnum(f, t + "gpu_t_limit_temp", t + "gpu_current_t_limit_temp", t + "gpu_temp_tlimit")
    tlimit = temp + margin if temp is not None and margin is not None else None

    def threshold(absolute: tuple[str, ...], relative: tuple[str, ...]) -> float | None:
        value = _pnum(f, *(t + k for k in absolute))
        rel = _pnum(f, *(t + k for k in relative))
        if value is None and rel is not None and tlimit is not None:
            value = tlimit - rel
        return value

    pw = ("gpu_power_readings/", "gpu_power_readings/gpu_ceiling_power_limit/", "power_readings/")

    def power(*names: str) -> float | None:
        return _pnum(f, *(s + n for n in names for s in pw))

    fan = _pnum(f, "fan_speed")
    persistence = (_pick(f, "persistence_mode") or "").lower()
    extra = {k: v for k, v in (("product_brand", _pick(f, "product_brand")),
                               ("vbios_version", _pick(f, "vbios_version")),
                               ("board_part_number", _pick(f, "board_part_number")),
                               ("pci_device_id", _pick(f, "pci/device_id", "pci/pci_device_id")),
                               ("mig_mode", _pick(f, "mig_mode/current", "mig_mode/current_mig")),
                               ("capture", cap.label or None)) if v}
    if tlimit is not None:
        extra["thresholds"] = "relative to T.Limit"
    return {
        "name": _pick(f, "product_name") or "",
        "pci_bus_id": cap.bus_id,
        "uuid": _masked(_pick(f, "gpu_uuid", "uuid")),
        "serial": _masked(_pick(f, "serial_number", "serial")),
        "architecture": _pick(f, "product_architecture"),
        "driver_version": cap.driver,
        "power_limit_w": power("requested_power_limit", "power_limit", "current_power_limit"),
        "enforced_power_limit_w": power("enforced_power_limit", "current_power_limit"),
        "default_power_limit_w": power("default_power_limit"),
        "min_power_limit_w": power("min_power_limit"),
        "max_power_limit_w": power("max_power_limit"),
        "power_draw_w": power("power_draw", "average_power_draw", "instantaneous_power_draw",
                              "instant_power_draw"),
        "temp_c": temp,
        "memory_temp_c": _pnum(f, t + "memory_current_temp", t + "memory_temp"),
        "shutdown_temp_c": threshold(("gpu_shutdown_temp", "gpu_temp_max_threshold"),
                                     ("gpu_shutdown_t_limit_temp", "gpu_temp_max_tlimit_threshold")),
        "slowdown_temp_c": threshold(("gpu_slowdown_temp", "gpu_temp_slow_threshold"),
                                     ("gpu_slowdown_t_limit_temp", "gpu_temp_slow_tlimit_threshold")),
        "max_operating_temp_c": threshold(
            ("gpu_max_operating_temp", "gpu_temp_max_gpu_threshold"),
            ("gpu_max_operating_t_limit_temp", "gpu_temp_max_gpu_tlimit_threshold")),
        "memory_max_temp_c": _pnum(f, t + "memory_max_operating_temp", t + "gpu_temp_max_mem_threshold"),
        "target_temp_c": _pnum(f, t + "gpu_target_temperature", t + "gpu_target_temperature_specification"),
        "gpu_util_pct": _pnum(f, "utilization/gpu", "utilization/gpu_util"),
        "memory_util_pct": _pnum(f, "utilization/memory", "utilization/memory_util"),
        "sm_clock_mhz": _pnum(f, "clocks/sm", "clocks/sm_clock"),
        "memory_clock_mhz": _pnum(f, "clocks/memory", "clocks/mem_clock"),
        "max_sm_clock_mhz": _pnum(f, "max_clocks/sm", "max_clocks/sm_clock"),
        "max_memory_clock_mhz": _pnum(f, "max_clocks/memory", "max_clocks/mem_clock"),
        "memory_total_mib": _pnum(f, "fb_memory_usage/total"),
        "memory_used_mib": _pnum(f, "fb_memory_usage/used"),
        "fan_speeds_pct": (fan,) if fan is not None else (),
        "persistence_mode": {"enabled": True, "disabled": False}.get(persistence),
        "pstate": _pick(f, "performance_state"),
        "extra": extra,
        "tlimit_temp_c": tlimit,
        "clock_event_reasons": _reasons(f),
        "processes": _processes(cap.processes),
    }


def _processes(entries: list[dict[str, str]]) -> tuple[GpuProcessInfo, ...]:
    """The parsed entries with a numeric pid (an entry without one is dropped)."""
    out = []
    for e in entries:
        pid = _num(e.get("pid"))
        if pid is None:
            continue
        gi, ci = _num(_pick(e, "gpu_instance_id")), _num(_pick(e, "compute_instance_id"))
        out.append(GpuProcessInfo(
            pid=int(pid), type=(e.get("type") or "C").strip() or "C",
            name=(e.get("process_name") or "").strip(),
            used_memory_mib=_pnum(e, "used_memory"), gpu_instance_id=None if gi is None else int(gi),
            compute_instance_id=None if ci is None else int(ci)))
    return tuple(out)


def _snapshot(label: str, fields: dict[str, Any]) -> GpuSnapshot:
    fans = fields["fan_speeds_pct"]
    return GpuSnapshot(
        label=label, temp_c=fields["temp_c"], memory_temp_c=fields["memory_temp_c"],
        power_draw_w=fields["power_draw_w"], gpu_util_pct=fields["gpu_util_pct"],
        memory_util_pct=fields["memory_util_pct"], sm_clock_mhz=fields["sm_clock_mhz"],
        memory_clock_mhz=fields["memory_clock_mhz"], fan_speed_pct=fans[0] if fans else None,
        pstate=fields["pstate"], clock_event_reasons=fields["clock_event_reasons"],
        processes=fields["processes"])


def _merge(captures: list[_Capture], source: str) -> list[GpuProfile]:
    merged: dict[str, dict[str, Any]] = {}
    snaps: dict[str, list[GpuSnapshot]] = {}
    for cap in captures:
        fields = _fields(cap)
        snaps.setdefault(cap.bus_id, []).append(_snapshot(cap.label, fields))
        base = merged.setdefault(cap.bus_id, fields)
        if base is fields:
            continue
        for k, v in fields.items():
            if k == "processes":
                continue  # each capture's own: the profile keeps the first capture's
            if base[k] in (None, "", ()) and v not in (None, "", ()):
                base[k] = v
            elif k == "extra":
                base[k] = {**v, **base[k]}
    return [GpuProfile(**fields, source=source, snapshots=tuple(snaps[bus]))
            for bus, fields in merged.items()]
