"""hwmon backend: every ``class/hwmon/hwmon*`` device, named and read the way lm-sensors does.

Source of the facts: the kernel hwmon sysfs ABI (Documentation/hwmon/sysfs-interface.rst) and libsensors
``lib/sysfs.c``. Channels are ``tempN`` (m°C), ``fanN`` (RPM), ``inN`` (mV), ``currN`` (mA), ``powerN`` (µW)
and ``energyN`` (µJ) with an ``_input`` file (power: ``_input``, else ``_average``); the label is the
``_label`` file's first line (None without one: lm-sensors then shows the attribute name); thresholds
``min``, ``max``, ``crit``, ``lcrit``, ``emergency``, ``cap`` are read once at discovery. Attributes live in
the hwmon class directory or, in the older layout (applesmc, old i2c drivers), in its ``device/``.

Chips: as libsensors, a ``class/hwmon`` entry needs a ``name`` and at least one known attribute; chips are
ordered by the bus path of their device (never by ``hwmonN``) and a repeated name gets ``#2``. Unlike
libsensors, a chip with only ``pwmN`` knobs, or on a bus libsensors does not know, is kept.

Knobs: ``pwmN`` (0–255, shown as duty %) with ``pwmN_enable`` (0 full speed, 1 manual, ≥2 automatic; some
drivers have none), handled by :class:`aithermd.backends.pwm.PwmKnob`; ``Knob.fan_channel`` is its ``fanN``.

Plausibility (:mod:`aithermd.backends.plausible`; a reading outside gets :attr:`Status.IMPLAUSIBLE`
and value None, with the reason in ``detail``): the range of its quantity, the chip's own physical range
(coretemp never above its TjMax), and temperature sentinels (−128/−127 °C, 127…128 °C). Thresholds
outside the quantity's range, and ``min``/``max`` pairs with max ≤ min (unconfigured limits such as
nct6798 ``in1_min = in1_max = 0``), are dropped.

Names: a chip without a ``name`` attribute (in its class directory or, older layout, its device) is
named after its driver (the ``device/driver`` link), so its fans and temperatures are not lost; libsensors
drops such a chip (lib/sysfs.c: "ignore any device without name attribute") and pwmconfig shows it as
"unknown". A chip with neither name nor driver is skipped. Channels a driver leaves unlabelled, or
labels the old way, get their documented name as ``Channel.alias`` (:mod:`aithermd.backends.labels`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

from aithermd import units
from aithermd.backends.chipname import chip_name_for
from aithermd.backends.fast import read_inputs
from aithermd.backends.guard import Quarantine
from aithermd.backends.ids import natural_key, same_chip_renamed, unique_ids
from aithermd.backends.labels import alias
from aithermd.backends.plausible import PLAUSIBLE, SENTINEL_CEILING_C, sentinel, temperature_range
from aithermd.backends.pwm import PwmKnob
from aithermd.backends.readers import HwmonReader
from aithermd.backends.sysfs import (
    Attribute,
    SysfsIO,
    read_optional_int,
    read_optional_text,
    why_not_writable,
)
from aithermd.clock import Clock, RealClock
from aithermd.errors import UnknownKnob
from aithermd.model import (
    UNITS,
    Channel,
    Device,
    DeviceKind,
    Knob,
    KnobKind,
    KnobValue,
    Quantity,
    Reading,
    Sample,
    Status,
)

KINDS: dict[str, tuple[Quantity, Callable[[float], float]]] = {
    "in": (Quantity.VOLTAGE, units.mv_to_v),
    "fan": (Quantity.FAN, float),
    "temp": (Quantity.TEMPERATURE, units.mc_to_c),
    "power": (Quantity.POWER, units.uw_to_w),
    "energy": (Quantity.ENERGY, units.uj_to_j),
    "curr": (Quantity.CURRENT, units.ma_to_a),
}
THRESHOLDS = ("min", "max", "crit", "lcrit", "emergency", "cap")
_ORDER = {kind: i for i, kind in enumerate(KINDS)}
_CHANNEL_FILE = re.compile(r"(in|fan|temp|power|energy|curr)(\d+)_(input|average)$")
_KNOWN_FILE = re.compile(
    r"(in|fan|temp|power|energy|curr|humidity|intrusion)\d+_\w+$|beep_enable$|cpu\d*_vid$"
)
_PWM_FILE = re.compile(r"pwm(\d+)$")


_NO_GAP = (math.inf, -math.inf)  # an empty sentinel interval: nothing in it


class _Input:
    """One channel's input file and what a plausible value of it is: ``lo``…``hi`` less the sentinel
    interval ``gap_lo``…``gap_hi`` (temperatures only)."""

    __slots__ = ("id", "device_id", "attr", "convert", "lo", "hi", "gap_lo", "gap_hi", "unit", "quantity",
                 "raw", "last")

    def __init__(self, channel: Channel, attr: Attribute, convert: Callable[[float], float],
                 driver: str = "") -> None:
        self.id, self.device_id, self.attr, self.convert = channel.id, channel.device_id, attr, convert
        self.quantity = channel.quantity
        if channel.quantity is Quantity.TEMPERATURE:
            self.lo, self.hi = temperature_range(driver, channel.thresholds)
            self.gap_lo, self.gap_hi = SENTINEL_CEILING_C
        else:
            self.lo, self.hi = PLAUSIBLE[channel.quantity]
            self.gap_lo, self.gap_hi = _NO_GAP
        self.unit = channel.unit
        self.raw: bytes | None = None  # the text of the last good read, and its reading (``last``)
        self.last: Reading | None = None

    def plausible(self, value: float) -> bool:
        """``value`` (channel unit) is within the range and not a sentinel."""
        return self.lo <= value <= self.hi and not self.gap_lo <= value <= self.gap_hi


def _nonsense(inp: _Input, raw: bytes) -> str:
    """Why a read that did not fail is implausible (the slow path of :meth:`HwmonBackend.sample`)."""
    if not raw:
        return "empty read"
    if raw[-1:] != b"\n":
        return f"torn read {raw[:32]!r}"
    try:
        value = inp.convert(int(raw))
    except ValueError:
        return f"not a number {raw[:32]!r}"
    why = sentinel(inp.quantity, value)
    if why is not None:
        return why
    return f"{value:g} {inp.unit} outside {inp.lo:g}…{inp.hi:g} {inp.unit}"


class HwmonBackend(Quarantine):
    """hwmon devices under ``sysfs_root`` (``<root>/class/hwmon``). Ids: ``hwmon:<chip>``, channels
    ``hwmon:<chip>/<attribute>``, knobs ``hwmon:<chip>/pwmN``. ``io`` is the file-access seam. A chip whose
    read hung is skipped while it is in ``skip`` (:mod:`aithermd.backends.guard`)."""

    kind = "hwmon"

    def __init__(
        self, sysfs_root: str = "/sys", io: SysfsIO | None = None, clock: Clock | None = None,
        leave: frozenset[str] = frozenset(),
    ) -> None:
        """``leave``: chip names left to another backend (the GPU drivers: :mod:`aithermd.backends.gpu_hwmon`)."""
        self.sysfs_root = sysfs_root
        self.leave = leave
        self.io = io or SysfsIO()
        self.clock = clock or RealClock()
        self._devices: list[Device] = []
        self._inputs: list[_Input] = []
        self._pwms: dict[str, PwmKnob] = {}
        self._input_counts: dict[str, int] = {}
        self.skip: dict[str, str] = {}

    # -- discovery -------------------------------------------------------------------------------------
    def discover(self) -> list[Device]:
        """Find every hwmon chip once (again on hotplug); ids never use the hwmonN number."""
        self.close()
        class_dir = os.path.join(self.sysfs_root, "class", "hwmon")
        try:
            names = self.io.listdir(class_dir)
        except OSError:
            names = []
        found = [
            p for p in (self._probe(os.path.join(class_dir, n)) for n in sorted(names, key=natural_key)) if p
        ]
        found.sort(key=lambda p: (p[0], str(p[1])))
        ids = unique_ids(f"hwmon:{chip}" for _, chip, _, _ in found)
        self._devices = [
            self._build(dev_id, chip, attr_dir, bus_path)
            for dev_id, (_, chip, attr_dir, bus_path) in zip(ids, found, strict=True)
        ]
        self._input_counts = {d.id: len(d.channels) for d in self._devices}
        return list(self._devices)

    def _probe(self, hwmon_dir: str) -> tuple[Any, Any, str, str] | None:
        io = self.io
        device_link = os.path.join(hwmon_dir, "device")
        has_device = self._is_link(device_link)
        candidates = [hwmon_dir] + ([device_link] if has_device else [])
        named = [(d, read_optional_text(io, os.path.join(d, "name"))) for d in candidates]
        if all(prefix is None for _, prefix in named) and has_device:
            driver = self._driver(device_link)  # no name anywhere: the driver's, where one is bound
            named = [(d, driver) for d in candidates]
        for attr_dir, prefix in named:  # libsensors: the hwmon class device first, then the device itself
            if not prefix:
                continue
            if prefix in self.leave:
                return None
            try:
                files = io.listdir(attr_dir)
            except OSError:
                continue
            if not any(_KNOWN_FILE.match(f) or _PWM_FILE.match(f) for f in files):
                continue
            chip = chip_name_for(io, self.sysfs_root, hwmon_dir, prefix)
            if chip is None:
                return None
            root = io.realpath(self.sysfs_root)
            bus_path = os.path.relpath(io.realpath(device_link if has_device else hwmon_dir), root)
            if not has_device:  # devices/virtual/hwmon/hwmonN: order virtual chips by name, not by N
                bus_path = f"devices/virtual/{prefix}"
            # every file is opened through the chip's own device path, never class/hwmon/hwmonN: after a
            # driver reload another chip may own that number, and a write or a reopen through it would
            # reach that chip; through the old device path it fails (ENOENT) and the device is rediscovered
            return natural_key(bus_path), chip, io.realpath(attr_dir), bus_path
        return None

    def _driver(self, device_link: str) -> str | None:
        try:
            target = self.io.readlink(os.path.join(device_link, "driver"))
        except OSError:
            return None
        return os.path.basename(target.rstrip("/")) or None

    def _is_link(self, path: str) -> bool:
        try:
            self.io.readlink(path)
            return True
        except OSError:
            return False

    def _build(self, dev_id: str, chip: Any, attr_dir: str, bus_path: str) -> Device:
        io = self.io
        files = set(io.listdir(attr_dir))
        channels: list[Channel] = []
        for kind, nr, suffix in sorted(
            {(m[1], int(m[2]), m[3]) for f in files if (m := _CHANNEL_FILE.match(f))},
            key=lambda k: (_ORDER[k[0]], k[1], k[2] != "input"),
        ):
            attribute = f"{kind}{nr}"
            if suffix == "average" and f"{attribute}_input" in files:
                continue
            quantity, convert = KINDS[kind]
            label = (read_optional_text(io, os.path.join(attr_dir, f"{attribute}_label"))
                     if f"{attribute}_label" in files else None)
            channel = Channel(
                id=f"{dev_id}/{attribute}",
                device_id=dev_id,
                attribute=attribute,
                quantity=quantity,
                unit=UNITS[quantity],
                label=label,
                thresholds=self._thresholds(attr_dir, files, attribute, quantity, convert),
                alias=alias(chip.prefix, attribute, label, os.path.basename(bus_path)),
            )
            channels.append(channel)
            attr = Attribute(io, os.path.join(attr_dir, f"{attribute}_{suffix}"))
            self._inputs.append(_Input(channel, attr, convert, chip.prefix))
        knobs = [
            self._pwm_knob(dev_id, attr_dir, files, int(m[1]), channels, chip.prefix)
            for f in sorted(files, key=natural_key)
            if (m := _PWM_FILE.match(f))
        ]
        return Device(
            id=dev_id,
            kind=DeviceKind.HWMON,
            name=chip.prefix,
            channels=tuple(channels),
            knobs=tuple(knobs),
            chip=str(chip),
            info={"adapter": chip.adapter, "bus_path": bus_path, "driver": chip.prefix},
        )

    def _thresholds(
        self,
        attr_dir: str,
        files: set[str],
        attribute: str,
        quantity: Quantity,
        convert: Callable[[float], float],
    ) -> dict[str, float]:
        lo, hi = PLAUSIBLE[quantity]
        out: dict[str, float] = {}
        for key in THRESHOLDS:
            name = f"{attribute}_{key}"
            if (
                name in files
                and (raw := read_optional_int(self.io, os.path.join(attr_dir, name))) is not None
            ):
                value = convert(raw)
                if lo <= value <= hi:
                    out[key] = value
        if "min" in out and "max" in out and out["max"] <= out["min"]:
            del out["min"], out["max"]
        return out

    def _pwm_knob(self, dev_id: str, attr_dir: str, files: set[str], nr: int, channels: list[Channel],
                  driver: str) -> Knob:
        io, has_enable = self.io, f"pwm{nr}_enable" in files
        pwm = Attribute(io, os.path.join(attr_dir, f"pwm{nr}"))
        enable = Attribute(io, os.path.join(attr_dir, f"pwm{nr}_enable")) if has_enable else None
        why_not = None
        if (why := why_not_writable(io, pwm.path)) is not None:
            why_not = f"pwm{nr} not writable ({why})"
        elif enable is not None and (why := why_not_writable(io, enable.path)) is not None:
            why_not = f"pwm{nr}_enable not writable ({why})"
        fan = f"{dev_id}/fan{nr}"
        knob = Knob(
            id=f"{dev_id}/pwm{nr}",
            device_id=dev_id,
            kind=KnobKind.PWM,
            unit=UNITS[Quantity.DUTY],
            min=0.0,
            max=100.0,
            writable=why_not is None,
            why_not=why_not,
            fan_channel=fan if any(c.id == fan for c in channels) else None,
        )
        self._pwms[knob.id] = PwmKnob(knob, pwm, enable, driver)
        return knob

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """Read every channel and pwm knob once through kept-open descriptors; never raises for a file.

        A device whose every input is gone (ENODEV/ENOENT) is listed in ``Sample.lost``."""
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}
        gone: dict[str, int] = {}
        skip = self.skip
        read_inputs(self, self._inputs, readings, gone, _nonsense)
        knobs = {}
        for knob_id, p in self._pwms.items():
            device = p.knob.device_id
            if skip and device in skip:
                knobs[knob_id] = KnobValue(knob_id, None, None, Status.STALE)
                continue
            self.reading = device
            knobs[knob_id] = p.read()
        self.reading = None
        lost = frozenset(d for d, n in gone.items() if n == self._input_counts[d])
        return Sample(t=t, readings=readings, knobs=knobs, lost=lost)

    def reader(self, channel_id: str) -> HwmonReader | None:
        """A reader of one discovered input through a descriptor of its own (the fast lane), or None when
        this backend does not read ``channel_id``."""
        for inp in self._inputs:
            if inp.id == channel_id:
                return HwmonReader(channel_id, Attribute(self.io, inp.attr.path), inp.convert,
                                   inp.plausible)
        return None

    # -- knobs -----------------------------------------------------------------------------------------
    def _pwm(self, knob_id: str) -> PwmKnob:
        if (p := self._pwms.get(knob_id)) is None:
            raise UnknownKnob(knob_id)
        return p

    def read_knob(self, knob_id: str) -> KnobValue:
        return self._pwm(knob_id).read()

    def write_knob(self, knob_id: str, value: float) -> None:
        """Set duty ``value`` % (0–100), switching ``pwmN_enable`` to manual first (see :class:`PwmKnob`)."""
        self._pwm(knob_id).write(value)

    def pwm_knob(self, knob_id: str) -> PwmKnob:
        """``knob_id``'s :class:`PwmKnob`: what it learnt of its driver (``settles_at``, ``mode_refused``).
        Raises UnknownKnob. (Looked up here, not through :meth:`_pwm`: asked of every knob at every tick.)"""
        if (p := self._pwms.get(knob_id)) is None:
            raise UnknownKnob(knob_id)
        return p

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """``{"pwm": 0–255, "enable": int | None}`` as found (see :meth:`PwmKnob.save`)."""
        return self._pwm(knob_id).save()

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> str | None:
        """Put ``saved`` back; returns a note when full duty had to stand in (see :meth:`PwmKnob.restore`).
        A knob no longer known under its id is looked for on a chip at the same bus address under another
        driver name (:func:`aithermd.backends.ids.same_chip_renamed`: a driver swapped or upgraded without a
        reboot names the nct6798 at ISA 0x290 nct6796; attack6 G5), and restored there, with a note."""
        pwm = self._pwms.get(knob_id)
        if pwm is None:
            now = same_chip_renamed(knob_id, self._pwms)
            if now is None:
                raise UnknownKnob(knob_id)
            note = self._pwms[now].restore(saved)
            said = f"{knob_id}: restored as {now} (its chip's driver names it so now)"
            return f"{said}; {note}" if note else said
        return pwm.restore(saved)

    def locator(self) -> dict[str, Any]:
        return {"backend": "hwmon", "sysfs_root": self.sysfs_root}

    def close(self) -> None:
        for inp in self._inputs:
            inp.attr.close()
        for p in self._pwms.values():
            p.close()
        self._inputs, self._pwms, self._devices = [], {}, []

    def __enter__(self) -> HwmonBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
