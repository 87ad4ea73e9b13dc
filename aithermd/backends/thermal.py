"""Thermal zones (``class/thermal/thermal_zone*``) as temperature sources, with hwmon's fault handling.

Source of the facts: the kernel thermal sysfs ABI (Documentation/driver-api/thermal/sysfs-api.rst):
``type`` names the zone (``acpitz``, ``x86_pkg_temp``, ``cpu-thermal``, ``iwlwifi_1``), ``temp`` is its
temperature in m°C, ``trip_point_N_type`` (``critical``, ``hot``, ``passive``, ``active``) and
``trip_point_N_temp`` (m°C) its trip points. Reading ``temp`` may run firmware (ACPI ``_TMP``) and fail
with an errno like any sysfs attribute.

Ids: ``thermal:<type>`` (``thermal:acpitz``, a second zone of the same type ``thermal:acpitz#2``), one
channel ``thermal:<type>/temp`` labelled with the type. Zones are virtual devices with no bus path, so they
are ordered by zone number, which follows their registration order at boot (the drivers probe in a fixed
order). Thresholds: the ``critical`` trip as ``crit`` (the kernel shuts the machine down there: the safety
layer acts its margin below), ``hot``, and the lowest ``passive`` and ``active`` trips. Trip points outside
the plausible range or at a sentinel (firmware writes 127 °C or −273.2 °C for an unused trip) are dropped.

Every zone is read on its own: one that fails, hangs up with ENODEV or reads nonsense gets its status and
reason, the others read on. Plausibility as hwmon's (:mod:`aithermd.backends.plausible`).
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from aithermd import units
from aithermd.backends.base import ReadOnly
from aithermd.backends.fast import ok_reading
from aithermd.backends.guard import Quarantine
from aithermd.backends.ids import natural_key, unique_ids
from aithermd.backends.plausible import SENTINEL_CEILING_C, sentinel, temperature_range
from aithermd.backends.sysfs import (
    Attribute,
    Nonsense,
    SysfsIO,
    classify_oserror,
    parse_int,
    read_optional_int,
    read_optional_text,
)
from aithermd.clock import Clock, RealClock
from aithermd.model import UNITS, Channel, Device, DeviceKind, Quantity, Reading, Sample, Status

_ZONE = re.compile(r"thermal_zone\d+$")
_TRIP = re.compile(r"trip_point_(\d+)_type$")
_GONE = (errno.ENODEV, errno.ENOENT)
TRIPS = {"critical": "crit", "hot": "hot", "passive": "passive", "active": "active"}


class ThermalBackend(ReadOnly, Quarantine):
    """Thermal zones under ``sysfs_root`` (``<root>/class/thermal``); ``io`` is the file-access seam."""

    kind = "thermal"

    def __init__(self, sysfs_root: str = "/sys", io: SysfsIO | None = None,
                 clock: Clock | None = None) -> None:
        self.sysfs_root = sysfs_root
        self.io = io or SysfsIO()
        self.clock = clock or RealClock()
        self._zones: list[tuple[str, str, Attribute, float, float]] = []  # channel, device, attr, lo, hi
        self.skip: dict[str, str] = {}

    def discover(self) -> list[Device]:
        self.close()
        class_dir = os.path.join(self.sysfs_root, "class", "thermal")
        try:
            names = sorted((n for n in self.io.listdir(class_dir) if _ZONE.match(n)), key=natural_key)
        except OSError:
            names = []
        found = []
        for name in names:
            zone_dir = os.path.join(class_dir, name)
            kind = read_optional_text(self.io, os.path.join(zone_dir, "type"))
            if kind and self.io.exists(os.path.join(zone_dir, "temp")):
                found.append((zone_dir, kind.strip()))
        devices = []
        for dev_id, (zone_dir, kind) in zip(unique_ids(f"thermal:{k}" for _, k in found), found, strict=True):
            thresholds = self._trips(zone_dir)
            channel = Channel(id=f"{dev_id}/temp", device_id=dev_id, attribute="temp",
                              quantity=Quantity.TEMPERATURE, unit=UNITS[Quantity.TEMPERATURE], label=kind,
                              thresholds=thresholds)
            lo, hi = temperature_range("", thresholds)
            attr = Attribute(self.io, os.path.join(zone_dir, "temp"))
            self._zones.append((channel.id, dev_id, attr, lo, hi))
            devices.append(Device(id=dev_id, kind=DeviceKind.THERMAL, name=kind, channels=(channel,),
                                  info={"zone": os.path.basename(zone_dir)}))
        return devices

    def _trips(self, zone_dir: str) -> dict[str, float]:
        try:
            files = self.io.listdir(zone_dir)
        except OSError:
            return {}
        lo, hi = temperature_range("", {})
        out: dict[str, float] = {}
        for f in sorted(files, key=natural_key):
            m = _TRIP.match(f)
            kind = read_optional_text(self.io, os.path.join(zone_dir, f)) if m else None
            key = TRIPS.get((kind or "").strip())
            if key is None or m is None:
                continue
            raw = read_optional_int(self.io, os.path.join(zone_dir, f"trip_point_{m[1]}_temp"))
            if raw is None:
                continue
            value = units.mc_to_c(raw)
            if not lo <= value <= hi or sentinel(Quantity.TEMPERATURE, value):
                continue
            out[key] = min(value, out.get(key, value))  # the lowest trip of each kind
        return out

    def sample(self) -> Sample:
        """Read every zone once; never raises for a zone. Zones that are gone are in ``Sample.lost``."""
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}
        lost = set()
        gap_lo, gap_hi = SENTINEL_CEILING_C
        skip = self.skip
        for cid, dev_id, attr, lo, hi in self._zones:
            if skip and dev_id in skip:
                readings[cid] = Reading(cid, None, Status.STALE, skip[dev_id])
                continue
            self.reading = dev_id
            try:
                value = units.mc_to_c(parse_int(attr.read()))
            except OSError as exc:
                if exc.errno in _GONE:
                    lost.add(dev_id)
                status, detail = classify_oserror(exc)
                readings[cid] = Reading(cid, None, status, detail)
                continue
            except Nonsense as exc:
                readings[cid] = Reading(cid, None, Status.IMPLAUSIBLE, str(exc))
                continue
            if lo <= value <= hi and not gap_lo <= value <= gap_hi:
                readings[cid] = ok_reading(cid, value)
            else:
                why = sentinel(Quantity.TEMPERATURE, value) or f"{value:g} °C outside {lo:g}…{hi:g} °C"
                readings[cid] = Reading(cid, None, Status.IMPLAUSIBLE, why)
        self.reading = None
        return Sample(t=t, readings=readings, lost=frozenset(lost))

    def locator(self) -> dict[str, Any]:
        return {"backend": "thermal", "sysfs_root": self.sysfs_root}

    def close(self) -> None:
        for _, _, attr, _, _ in self._zones:
            attr.close()
        self._zones = []
