"""Fault injection for the simulated workstation: ``aithermd run --simulate --fault SPEC`` (repeatable).

Like DCGM's NVML injection, so admins can watch their alerts fire and the tests drive the daemon through the
same interface. A spec is ``TARGET:FAULT@WHEN``:

- ``TARGET``: ``gpuN`` (the Nth simulated GPU, every NVML call on it), ``gpuN/FUNCTION`` (one NVML call:
  ``gpu0/nvmlDeviceGetPowerUsage``, the ``nvml`` prefix optional), ``nvml`` (the library: every call,
  ``nvmlInit`` included), or a channel of the board, ``hwmon:CHIP/ATTRIBUTE`` (``hwmon:nct6798-isa-0290/
  temp2``) or ``powercap:ZONE/energy``;
- ``FAULT`` for NVML targets: an ``nvmlReturn_t`` name without its prefix (``GPU_IS_LOST``, ``UNKNOWN``,
  ``LIB_RM_VERSION_MISMATCH``, ``DRIVER_NOT_LOADED``, ``NO_DATA``, ``NOT_SUPPORTED``, ``NO_PERMISSION``,
  ``NOT_READY``, ``TIMEOUT``, ...), ``HANG`` (calls on the GPU block), ``ABSENT`` (no longer enumerated: a
  hot-remove) or ``CAP=WATTS`` (an out-of-band power cap, ``CAP=200W``); for board channels an errno name
  (``EIO``, ``ENODATA``, ``EAGAIN``, ``ENXIO``, ``EACCES``, ...), raised by every read of the file;
- ``WHEN``: simulated time since the start, ``@T`` (from T on) or ``@T1-T2`` (from T1 until T2), each a
  number with ``s``, ``m`` or ``h``, or several (``@120s``, ``@1m-90s``, ``@2h``, ``@2h-2h30m``); a bare
  number is seconds, a bare end is in the start's unit.

Examples: ``gpu1:GPU_IS_LOST@120s`` (gpu1 falls off the bus at 2 min, for good), ``gpu0:UNKNOWN@60s-90s``,
``nvml:LIB_RM_VERSION_MISMATCH@10m-12m`` (a driver upgrade, then a module reload),
``hwmon:nct6798-isa-0290/temp2:EIO@30s``. A GPU fault that ends (``GPU_IS_LOST``, ``ABSENT``) brings the GPU
back as after a reset. Faults follow the fakes' behaviour: a library failure breaks the open NVML session
until the daemon initialises NVML again, as the real library does.
"""

from __future__ import annotations

import errno as errno_module
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.backends.sysfs import SysfsIO, read_optional_text

_NUM = r"[0-9]+(?:\.[0-9]+)?"  # ASCII digits only (float() also takes other scripts' digits)
# 90, 90s, 1m30s, 2h30m, 1h0m5s: hours, minutes, seconds, each at most once and in that order
_DURATION = rf"{_NUM}h(?:{_NUM}m)?(?:{_NUM}s)?|{_NUM}m(?:{_NUM}s)?|{_NUM}s|{_NUM}"
_WHEN = re.compile(rf"^(?P<a>{_DURATION})(?:-(?P<b>{_DURATION}))?$")
_PART = re.compile(rf"({_NUM})([smh]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_GPU = re.compile(r"^gpu(?P<n>[0-9]+)(?:/(?P<fn>[A-Za-z0-9_]+))?$")  # ASCII: 'gpu٠' is no GPU
_CAP = re.compile(r"^CAP=(?P<w>\d+(?:\.\d+)?)W?$", re.I)
SPECIAL = ("HANG", "ABSENT")


class FaultSpecError(ValueError):
    """A ``--fault`` spec that does not parse: the message says what is wrong and what is expected."""


@dataclass(frozen=True)
class Fault:
    """One parsed spec: ``target`` (``gpu``, ``nvml`` or ``file``), ``gpu`` (position), ``function``,
    ``channel`` (``hwmon:CHIP/ATTR`` or ``powercap:ZONE/energy``), ``kind`` (``code``, ``hang``, ``absent``,
    ``cap``, ``errno``), ``value`` (the NVML code, watts or errno), ``start``/``end`` (simulated s; end None:
    for good) and the ``spec`` as given."""

    spec: str
    target: str
    kind: str
    value: float
    start: float
    end: float | None
    gpu: int | None = None
    function: str | None = None
    channel: str | None = None

    def active(self, t_s: float) -> bool:
        return t_s >= self.start and (self.end is None or t_s < self.end)


def _seconds(text: str, bare_unit: str = "s") -> tuple[float, str]:
    """``text`` (``90``, ``90s``, ``1m30s``, ``2h30m``) in seconds, and its last unit; a bare number is in
    ``bare_unit``."""
    total, unit = 0.0, bare_unit
    for number, u in _PART.findall(text):
        unit = u or bare_unit
        total += float(number) * _UNIT[unit]
    return total, unit


def seconds(text: str) -> float:
    """``text`` (``90``, ``90s``, ``10m``, ``1m30s``, ``2h``) in seconds, >= 0. Raises ValueError for
    anything else (a sign, another unit, ``nan``)."""
    if not re.fullmatch(_DURATION, text.strip()):
        raise ValueError(f"{text!r}: give seconds, or a duration like 90s, 10m or 1h30m")
    return _seconds(text.strip())[0]


def _nvml_code(name: str, spec: str) -> int:
    import pynvml

    code = getattr(pynvml, f"NVML_ERROR_{name.upper()}", None)
    if not isinstance(code, int):
        known = sorted(n.removeprefix("NVML_ERROR_") for n in dir(pynvml) if n.startswith("NVML_ERROR_"))
        raise FaultSpecError(f"{spec}: {name!r} is no NVML error; use one of {', '.join(known)}, HANG, "
                             "ABSENT or CAP=WATTS")
    return code


def parse(spec: str) -> Fault:
    """One ``TARGET:FAULT@WHEN`` spec (see the module doc). Raises FaultSpecError."""
    text = spec.strip()
    body, at, when = text.rpartition("@")
    if not at:
        raise FaultSpecError(f"{spec}: no @WHEN (e.g. gpu1:GPU_IS_LOST@120s or gpu0:UNKNOWN@60s-90s)")
    m = _WHEN.match(when)
    if m is None:
        raise FaultSpecError(f"{spec}: {when!r} is no time: T or T1-T2, each a number with s, m or h "
                             "(90s, 1m30s, 2h30m)")
    start, unit = _seconds(m["a"])
    end = _seconds(m["b"], unit)[0] if m["b"] is not None else None  # @1-2m: a bare end in the start's unit
    if end is not None and end < start:
        raise FaultSpecError(f"{spec}: the fault ends ({end:g} s) before it starts ({start:g} s)")
    if end is not None and end == start:
        raise FaultSpecError(f"{spec}: the fault ends as it starts ({start:g} s): give an end after the start")
    target, colon, fault = body.rpartition(":")
    if not colon or not target or not fault:
        raise FaultSpecError(f"{spec}: expected TARGET:FAULT@WHEN")
    if target.startswith(("hwmon:", "powercap:")):
        name = fault.upper()
        code = getattr(errno_module, name, None)
        if not name.startswith("E") or not isinstance(code, int):
            raise FaultSpecError(f"{spec}: {fault!r} is no errno name (EIO, ENODATA, EAGAIN, ENXIO, "
                                 "EACCES...)")
        if "/" not in target:
            raise FaultSpecError(f"{spec}: name the channel, e.g. hwmon:nct6798-isa-0290/temp2")
        return Fault(text, "file", "errno", float(code), start, end, channel=target)
    cap = _CAP.match(fault)
    if cap is None and fault.upper().startswith("CAP"):
        raise FaultSpecError(f"{spec}: {fault!r} is no power cap: CAP=WATTS, a number of watts (CAP=200 or "
                             "CAP=200W), e.g. gpu0:CAP=200W@60s")
    if target == "nvml":
        if cap or fault.upper() in SPECIAL:
            raise FaultSpecError(f"{spec}: the library fails with an NVML error; HANG, ABSENT and CAP are "
                                 "per GPU")
        return Fault(text, "nvml", "code", float(_nvml_code(fault, spec)), start, end)
    g = _GPU.match(target)
    if g is None:
        raise FaultSpecError(f"{spec}: {target!r} is no target: gpuN, gpuN/FUNCTION, nvml, "
                             "hwmon:CHIP/ATTR or powercap:ZONE/energy")
    gpu, fn = int(g["n"]), g["fn"]
    if cap:
        return Fault(text, "gpu", "cap", float(cap["w"]), start, end, gpu=gpu)
    if fault.upper() in SPECIAL:
        if fn:
            raise FaultSpecError(f"{spec}: {fault.upper()} is about the whole GPU, not one call")
        return Fault(text, "gpu", fault.lower(), 0.0, start, end, gpu=gpu)
    function = None if fn is None else (fn if fn.startswith("nvml") else "nvml" + fn)
    if function is not None:
        import pynvml
        if not function.startswith("nvmlDevice") or not callable(getattr(pynvml, function, None)):
            raise FaultSpecError(f"{spec}: {fn!r} is no NVML device function (e.g. DeviceGetPowerUsage, "
                                 "DeviceGetTemperature, DeviceSetPowerManagementLimit)")
    return Fault(text, "gpu", "code", float(_nvml_code(fault, spec)), start, end, gpu=gpu, function=function)


def parse_all(specs: Iterable[str]) -> list[Fault]:
    return [parse(s) for s in specs]


class FaultIO(SysfsIO):
    """The board's file access with faults: a read of a file in :attr:`active` (real path → errno) raises
    that errno, as a driver would."""

    def __init__(self) -> None:
        self.active: dict[str, int] = {}
        self._paths: dict[int, str] = {}

    def open(self, path: str) -> int:
        fd = super().open(path)
        self._paths[fd] = os.path.realpath(path)
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def pread(self, fd: int, size: int) -> bytes:
        if self.active:
            code = self.active.get(self._paths.get(fd, ""))
            if code is not None:
                raise OSError(code, os.strerror(code))
        return super().pread(fd, size)


def channel_path(sysfs_root: str, channel: str, io: SysfsIO | None = None) -> str | None:
    """The file a ``hwmon:CHIP/ATTR`` or ``powercap:ZONE/energy`` channel id reads, or None."""
    from aithermd.backends.chipname import chip_name_for

    io = io or SysfsIO()
    device, _, attr = channel.partition("/")
    family, _, name = device.partition(":")
    if family == "powercap":
        base = os.path.join(sysfs_root, "class", "powercap")
        for zone in sorted(io.listdir(base)) if os.path.isdir(base) else ():
            if read_optional_text(io, os.path.join(base, zone, "name")) == name:
                return os.path.realpath(os.path.join(base, zone, "energy_uj"))
        return None
    base = os.path.join(sysfs_root, "class", "hwmon")
    for hw in sorted(io.listdir(base)) if os.path.isdir(base) else ():
        hwmon_dir = os.path.join(base, hw)
        for attr_dir in (hwmon_dir, os.path.join(hwmon_dir, "device")):
            prefix = read_optional_text(io, os.path.join(attr_dir, "name"))
            if prefix and str(chip_name_for(io, sysfs_root, hwmon_dir, prefix)) == name:
                path = os.path.join(attr_dir, f"{attr}_input")
                if os.path.exists(path):
                    return os.path.realpath(path)
    return None


class FaultPlan:
    """The faults of one simulation, applied to the fake NVML (``nvml``, a
    :class:`~aithermd.sim.fake_nvml.FakeNvml`) and the board's :class:`FaultIO` as simulated time passes
    (:meth:`apply`). Raises FaultSpecError for a board channel the machine does not have."""

    def __init__(self, faults: Sequence[Fault], nvml: Any, io: FaultIO | None, sysfs_root: str) -> None:
        self.faults = list(faults)
        self.nvml, self.io = nvml, io
        self._on: set[int] = set()
        self._paths: dict[int, str] = {}
        self._log = structlog.get_logger("aithermd.sim.faults")
        for i, f in enumerate(self.faults):
            if f.target == "file":
                path = channel_path(sysfs_root, f.channel or "")
                if path is None:
                    raise FaultSpecError(f"{f.spec}: the simulated board has no channel {f.channel}")
                self._paths[i] = path
            elif f.target == "gpu" and not 0 <= (f.gpu or 0) < len(nvml.gpus):
                raise FaultSpecError(f"{f.spec}: the simulated workstation has {len(nvml.gpus)} GPUs "
                                     f"(gpu0–gpu{len(nvml.gpus) - 1})")
        self.log: list[tuple[float, str, str]] = []  # (t_s, "on"|"off", spec)

    def apply(self, t_s: float) -> None:
        """Turn on the faults whose time came and off those whose time is over."""
        for i, f in enumerate(self.faults):
            on = f.active(t_s)
            if on == (i in self._on):
                continue
            (self._on.add if on else self._on.discard)(i)
            self._switch(i, f, on)
            self.log.append((round(t_s, 3), "on" if on else "off", f.spec))
            self._log.warning("fault_injected" if on else "fault_cleared", spec=f.spec, t_s=round(t_s, 1))

    def _switch(self, i: int, f: Fault, on: bool) -> None:
        nv = self.nvml
        if f.target == "nvml":
            nv.fail_library(int(f.value) if on else None)
        elif f.target == "file":
            if self.io is not None:
                if on:
                    self.io.active[self._paths[i]] = int(f.value)
                else:
                    self.io.active.pop(self._paths[i], None)
        elif f.kind == "code":
            if on:
                nv.inject(f.function or "*", f.gpu, int(f.value))
            else:
                nv.clear_injections(f.function or "*", f.gpu)
                if int(f.value) == 15:  # GPU_IS_LOST with no count loses the GPU for good: back after a reset
                    nv.revive_gpu(f.gpu)
        elif f.kind == "hang":
            nv.hang(f.gpu) if on else nv.unhang(f.gpu)
        elif f.kind == "absent":
            nv.remove_gpu(f.gpu) if on else nv.revive_gpu(f.gpu)
        elif f.kind == "cap":
            nv.cap_power(f.gpu, f.value if on else None)
