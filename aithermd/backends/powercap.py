"""powercap/RAPL backend: zones under ``class/powercap/intel-rapl*``.

Source: Documentation/power/powercap/powercap.rst and the intel_rapl driver.

Each zone (and subzone) is a device ``powercap:<name>`` named by its ``name`` file (``package-0``, ``core``,
``uncore``, ``dram``, ``psys``); repeated names get ``#2`` in bus order (``intel-rapl:0:0`` before
``intel-rapl:1:0``; the MSR interface before ``intel-rapl-mmio``). Without ``class/powercap`` the zones are
looked for under ``devices/virtual/powercap``.

Channels: ``energy`` (J) and ``power`` (W) from ``energy_uj``, wraps, gaps and sleeps included
(:mod:`aithermd.backends.powercap_energy`). Since CVE-2020-8694 ``energy_uj`` is readable only by root:
that is found at discovery, logged once with the reason and reported as ``not_supported``, never as a crash
or a failure; discovery (a reload) probes it again.

Zones are told apart for totals (:mod:`aithermd.backends.powercap_zones`): ``Device.info["role"]`` is
``package``, ``platform`` (psys) or the subzone's name; a subzone, the platform and a second (MMIO) copy of
a package carry ``info["in_total"] = False`` (a copy also ``duplicate_of``), so no total counts them. A
machine without RAPL packages (AMD without powercap) gets its packages from the ``amd_energy``/``zenergy``
hwmon socket counters: ``powercap:package-N``, energy only.

Knobs: ``constraint_N_name`` ``long_term`` → ``pl1``, ``short_term`` → ``pl2``; value from
``constraint_N_power_limit_uw`` in W, ``max`` from ``constraint_N_max_power_uw`` (when > 0), ``min`` from
``constraint_N_min_power_uw`` (when present); the time windows go in ``Device.info`` (``pl1_time_window_s``).
"""

from __future__ import annotations

import errno
import math
import os
from typing import Any

import structlog

from aithermd import units
from aithermd.backends.energy_rate import POWER_MARGIN
from aithermd.backends.guard import Quarantine
from aithermd.backends.ids import natural_key, unique_ids
from aithermd.backends.powercap_energy import (  # noqa: F401 - energy_increase_uj, MAX_PLAUSIBLE_W: API
    MAX_PLAUSIBLE_W,
    _Zone,
    account,
    energy_increase_uj,
)
from aithermd.backends.powercap_zones import amd_energy_sockets, max_gap_s, zone_role
from aithermd.backends.saved_limits import RAPL_CEILING_UW
from aithermd.backends.sysfs import (
    Attribute,
    Nonsense,
    SysfsIO,
    classify_oserror,
    read_optional_int,
    read_optional_text,
    why_not_writable,
    write_error,
)
from aithermd.clock import Clock, RealClock
from aithermd.errors import BackendError, OutOfRange, RefusedOriginal, UnknownKnob
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

CONSTRAINT_KINDS = {"long_term": KnobKind.PL1, "short_term": KnobKind.PL2}
ROOT_ONLY = "energy_uj readable only by root (CVE-2020-8694)"
LOCKED = "needs root, or the limit is locked by firmware"


class _Limit:
    __slots__ = ("knob", "limit", "window")

    def __init__(self, knob: Knob, limit: Attribute, window: Attribute | None) -> None:
        self.knob, self.limit, self.window = knob, limit, window


class RaplBackend(Quarantine):
    """RAPL zones under ``sysfs_root``; ``clock`` times the energy reads, ``io`` is the file-access seam.
    Each zone is a device of the read guard (:class:`~aithermd.backends.guard.Quarantine`): a hung read of
    one zone's file (``energy_uj`` or a limit) holds that zone only, not the others (attack13 A5)."""

    kind = "powercap"

    def __init__(
        self, sysfs_root: str = "/sys", clock: Clock | None = None, io: SysfsIO | None = None
    ) -> None:
        self.sysfs_root = sysfs_root
        self.clock = clock or RealClock()
        # time the machine slept counts here, not in monotonic (clock_gettime(2)): a clock without it has none
        self._boottime = getattr(self.clock, "boottime", self.clock.monotonic)
        self.io = io or SysfsIO()
        self._zones: list[_Zone] = []
        # zones gone at a rediscovery, by (id, energy file): their counts, for when they come back (T9)
        self._away: dict[tuple[str, str], _Zone] = {}
        self._limits: dict[str, _Limit] = {}
        self._zone_limits: dict[str, list[_Limit]] = {}  # zone device id → its limits, read with it
        self.skip: dict[str, str] = {}
        self._why_logged: dict[str, str] = {}  # zone → the reason its energy was last logged unreadable

    # -- discovery -------------------------------------------------------------------------------------
    def _zone_dirs(self) -> list[str]:
        io = self.io
        class_dir = os.path.join(self.sysfs_root, "class", "powercap")
        try:
            return [os.path.join(class_dir, n) for n in io.listdir(class_dir) if n.startswith("intel-rapl")]
        except OSError:
            pass
        out: list[str] = []
        stack = [os.path.join(self.sysfs_root, "devices", "virtual", "powercap")]
        while stack:
            d = stack.pop()
            try:
                names = io.listdir(d)
            except OSError:
                continue
            for n in names:
                if n.startswith("intel-rapl") and io.is_dir(os.path.join(d, n)):
                    out.append(os.path.join(d, n))
                    stack.append(os.path.join(d, n))
        return out

    def discover(self) -> list[Device]:
        """Every RAPL zone with a ``name``; ids ``powercap:<name>`` (``#2`` for repeats). Discovering again (a
        reload, hotplug) keeps the energy counter of a zone still there (same id and file): its power needs
        no second read, its energy total runs on. A zone that left (``rmmod intel_rapl_msr``, a rescan
        while it was absent) and comes back goes on from its total too, as the event counters of a device
        that leaves and returns do (:mod:`aithermd.publish.event_counters`): the exported
        ``aithermd_rapl_energy_joules_total`` never goes back without a restart (attack8 T9: 292 kJ →
        30 kJ)."""
        counters = {**self._away, **{(z.device_id, z.energy.path): z for z in self._zones}}
        self.close()
        io = self.io
        zones = []
        for path in self._zone_dirs():
            name = read_optional_text(io, os.path.join(path, "name"))
            if name:
                base = os.path.basename(path)
                zones.append(((base.startswith("intel-rapl-mmio"), natural_key(base)), base, name, path))
        zones.sort(key=lambda z: z[0])
        ids = unique_ids(f"powercap:{name}" for _, _, name, _ in zones)
        by_base = {base: dev_id for dev_id, (_, base, _, _) in zip(ids, zones, strict=True)}
        msr = {name: dev_id for dev_id, (mmio, base, name, _) in zip(ids, zones, strict=True)
               if not mmio[0] and base.count(":") == 1}
        devices = []
        for dev_id, ((mmio, _), base, name, path) in zip(ids, zones, strict=True):
            parent = by_base.get(base.rsplit(":", 1)[0]) if base.count(":") > 1 else None
            copy_of = msr.get(name) if mmio and parent is None else None
            devices.append(self._build(dev_id, base, name, path, parent, copy_of))
        if not any(d.info.get("role") == "package" for d in devices):
            devices += self._amd_sockets({d.id for d in devices})
        for zone in self._zones:
            if (old := counters.get((zone.device_id, zone.energy.path))) is not None:
                zone.prev_raw, zone.prev_t, zone.total_uj = old.prev_raw, old.prev_t, old.total_uj
                zone.prev_boot, zone.rate_w = old.prev_boot, old.rate_w
        present = {(z.device_id, z.energy.path) for z in self._zones}
        self._away = {k: z for k, z in counters.items() if k not in present}
        return devices

    def _amd_sockets(self, taken: set[str]) -> list[Device]:
        """Packages from ``amd_energy``/``zenergy`` socket counters (µJ, no wrap, no limits)."""
        out = []
        for socket, path, chip in amd_energy_sockets(self.io, self.sysfs_root):
            dev_id = f"powercap:package-{socket}"
            if dev_id in taken:
                continue
            taken.add(dev_id)
            energy = Attribute(self.io, path)
            why_not = self._probe_energy(dev_id, energy)
            self._zones.append(_Zone(dev_id, energy, why_not, None))
            info: dict[str, Any] = {"zone": chip, "parent": None, "role": "package", "source": chip}
            if why_not:
                info["energy_why_not"] = why_not
            out.append(Device(id=dev_id, kind=DeviceKind.POWERCAP, name=f"package-{socket}",
                              channels=self._channels(dev_id, f"package-{socket}"), info=info))
        return out

    def _probe_energy(self, dev_id: str, energy: Attribute) -> str | None:
        """Why ``energy`` cannot be read (logged once per zone and reason), or None."""
        try:
            energy.read()
        except OSError as exc:
            why = ROOT_ONLY if exc.errno in (errno.EACCES, errno.EPERM) else classify_oserror(exc)[1]
            energy.close()
            if self._why_logged.get(dev_id) != why:
                self._why_logged[dev_id] = why
                structlog.get_logger("aithermd.powercap").warning(
                    "rapl_energy_unavailable", zone=dev_id, reason=why,
                    message=f"{dev_id}: {why}; its power and energy are not reported (probed again on "
                            "reload)")
            return why
        self._why_logged.pop(dev_id, None)
        return None

    @staticmethod
    def _channels(dev_id: str, name: str) -> tuple[Channel, Channel]:
        return (
            Channel(f"{dev_id}/power", dev_id, "power", Quantity.POWER, UNITS[Quantity.POWER],
                    f"{name} power"),
            Channel(f"{dev_id}/energy", dev_id, "energy", Quantity.ENERGY, UNITS[Quantity.ENERGY],
                    f"{name} energy"),
        )

    def _build(self, dev_id: str, base: str, name: str, path: str, parent: str | None,
               copy_of: str | None) -> Device:
        io = self.io
        energy = Attribute(io, os.path.join(path, "energy_uj"))
        why_not = self._probe_energy(dev_id, energy)
        channels = self._channels(dev_id, name)
        role = zone_role(name, parent)
        info: dict[str, Any] = {"zone": base, "parent": parent, "role": role}
        if parent is not None or role == "platform" or copy_of is not None:
            info["in_total"] = False  # inside its package, the whole platform, or the package again
        if copy_of is not None:
            info["duplicate_of"] = copy_of
        if why_not:
            info["energy_why_not"] = why_not
        knobs = []
        max_w = 0.0
        n = 0
        while (cname := read_optional_text(io, os.path.join(path, f"constraint_{n}_name"))) is not None:
            kind = CONSTRAINT_KINDS.get(cname.strip())
            prefix = os.path.join(path, f"constraint_{n}_")
            max_w = max(max_w, units.uw_to_w(read_optional_int(io, prefix + "max_power_uw") or 0))
            if kind is not None and io.exists(prefix + "power_limit_uw"):
                window = read_optional_int(io, prefix + "time_window_us")
                if window is not None:
                    info[f"{kind}_time_window_s"] = units.us_to_s(window)
                knobs.append(self._limit(dev_id, kind, prefix, window is not None))
            n += 1
        max_range = read_optional_int(io, os.path.join(path, "max_energy_range_uj"))
        # a subzone that states no power of its own (core, uncore) draws part of its package's: its counter
        # represents at least as long a gap as at the package's highest power
        gap_w = max_w or None
        if gap_w is None and parent is not None:
            gap_w = next((z.suspect_w / POWER_MARGIN for z in self._zones
                          if z.device_id == parent and z.suspect_w), None)
        self._zones.append(_Zone(dev_id, energy, why_not, max_range, max_gap_s(max_range, gap_w),
                                 POWER_MARGIN * max_w if max_w > 0 else None))
        return Device(id=dev_id, kind=DeviceKind.POWERCAP, name=name, channels=channels, knobs=tuple(knobs),
                      info=info)

    def _limit(self, dev_id: str, kind: KnobKind, prefix: str, has_window: bool) -> Knob:
        io = self.io
        hi = read_optional_int(io, prefix + "max_power_uw")
        lo = read_optional_int(io, prefix + "min_power_uw")
        limit = Attribute(io, prefix + "power_limit_uw")
        why = why_not_writable(io, limit.path)
        writable = why is None
        knob = Knob(id=f"{dev_id}/{kind}", device_id=dev_id, kind=kind, unit=UNITS[Quantity.POWER],
                    min=units.uw_to_w(lo) if lo is not None and lo > 0 else None,
                    max=units.uw_to_w(hi) if hi is not None and hi > 0 else None, writable=writable,
                    why_not=None if writable else f"{os.path.basename(limit.path)} not writable ({why})")
        window = Attribute(io, prefix + "time_window_us") if has_window else None
        self._limits[knob.id] = lim = _Limit(knob, limit, window)
        self._zone_limits.setdefault(dev_id, []).append(lim)
        return knob

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """Read each zone's ``energy_uj`` and its limits once; power over the measured interval. A zone the
        read guard quarantined (``skip``) is not read: its channels and limits are stale."""
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        lost: set[str] = set()
        skip = self.skip
        for zone in self._zones:
            dev_id = zone.device_id
            limits = self._zone_limits.get(dev_id, ())
            if skip and (why := skip.get(dev_id)) is not None:
                for cid in (f"{dev_id}/power", f"{dev_id}/energy"):
                    readings[cid] = Reading(cid, None, Status.STALE, why)
                for lim in limits:
                    knobs[lim.knob.id] = KnobValue(lim.knob.id, None, status=Status.STALE)
                continue
            self.reading = dev_id
            self._sample_energy(zone, readings, lost)
            for lim in limits:
                knobs[lim.knob.id] = self._read_limit(lim)
        self.reading = None
        return Sample(t=self.clock.monotonic(), readings=readings, knobs=knobs, lost=frozenset(lost))

    def _sample_energy(self, zone: _Zone, readings: dict[str, Reading], lost: set[str]) -> None:
        power_id, energy_id = f"{zone.device_id}/power", f"{zone.device_id}/energy"
        if zone.why_not:
            readings[power_id] = Reading(power_id, None, Status.NOT_SUPPORTED, zone.why_not)
            readings[energy_id] = Reading(energy_id, None, Status.NOT_SUPPORTED, zone.why_not)
            return
        try:
            raw = zone.energy.read_int()
        except (OSError, Nonsense) as exc:
            if isinstance(exc, OSError):
                status, detail = classify_oserror(exc)
                if exc.errno in (errno.ENODEV, errno.ENOENT):
                    lost.add(zone.device_id)
            else:
                status, detail = Status.IMPLAUSIBLE, str(exc)
            readings[power_id] = Reading(power_id, None, status, detail)
            readings[energy_id] = Reading(energy_id, None, status, detail)
            return
        readings[power_id], readings[energy_id] = account(zone, raw, self.clock.monotonic(), self._boottime())

    def _account(self, zone: _Zone, raw: int, t: float, boot: float | None = None) -> tuple[Reading, Reading]:
        """:func:`~aithermd.backends.powercap_energy.account` (``boot``: CLOCK_BOOTTIME s; None: ``t``)."""
        return account(zone, raw, t, t if boot is None else boot)

    def _read_limit(self, lim: _Limit) -> KnobValue:
        try:
            return KnobValue(lim.knob.id, units.uw_to_w(lim.limit.read_int()))
        except OSError as exc:
            return KnobValue(lim.knob.id, None, status=classify_oserror(exc)[0])
        except Nonsense:
            return KnobValue(lim.knob.id, None, status=Status.IMPLAUSIBLE)

    # -- knobs -----------------------------------------------------------------------------------------
    def _lim(self, knob_id: str) -> _Limit:
        try:
            return self._limits[knob_id]
        except KeyError:
            raise UnknownKnob(knob_id) from None

    def read_knob(self, knob_id: str) -> KnobValue:
        return self._read_limit(self._lim(knob_id))

    def write_knob(self, knob_id: str, value: float) -> None:
        """Set the power limit to ``value`` W; raises OutOfRange outside (0, max] / below min (NaN and
        infinity too, also when the zone states no max), NoPermission, DeviceLost or BackendError."""
        lim = self._lim(knob_id)
        k = lim.knob
        if (
            not math.isfinite(value)
            or value <= 0
            or (k.max is not None and value > k.max)
            or (k.min is not None and value < k.min)
        ):
            raise OutOfRange(
                f"{knob_id}: {value} W outside ({k.min or 0:g}, {k.max if k.max is not None else '∞'}] W"
            )
        try:
            lim.limit.write_int(units.w_to_uw(value))
        except OSError as exc:
            raise write_error(exc, f"{knob_id} := {value:g} W", denied_hint=LOCKED) from exc

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """``{"power_limit_uw": int, "time_window_us": int | None}`` as found (raw powercap units)."""
        lim = self._lim(knob_id)
        try:
            limit = lim.limit.read_int()
            window = lim.window.read_int() if lim.window is not None else None
        except OSError as exc:
            raise write_error(exc, f"{knob_id}: cannot read the original", denied_hint=LOCKED) from exc
        except Nonsense as exc:
            raise BackendError(f"{knob_id}: cannot read the original: {exc}") from exc
        return {"power_limit_uw": limit, "time_window_us": window}

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        """Write back the saved time window, then the saved power limit. A saved value that is no integer
        from 0, or a limit over :data:`RAPL_CEILING_UW`, raises RefusedOriginal, nothing written (the
        firmware's own limit may exceed ``max_power_uw``: that is no reason to refuse it)."""
        lim = self._lim(knob_id)
        for key, top in (("time_window_us", None), ("power_limit_uw", RAPL_CEILING_UW)):
            value = saved.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0
                                      or (top is not None and value > top)):  # 0: a zone with no limit set
                raise RefusedOriginal(f"{knob_id}: saved {key} {value!r} is no original of a RAPL limit "
                                      f"(an integer from 0{f' to {top}' if top else ''}): not written")
        try:
            if saved.get("time_window_us") is not None and lim.window is not None:
                lim.window.write_int(int(saved["time_window_us"]))
            if saved.get("power_limit_uw") is not None:
                lim.limit.write_int(int(saved["power_limit_uw"]))
        except OSError as exc:
            raise write_error(exc, f"{knob_id}: restore", denied_hint=LOCKED) from exc

    def locator(self) -> dict[str, Any]:
        return {"backend": "powercap", "sysfs_root": self.sysfs_root}

    def close(self) -> None:
        for zone in self._zones:
            zone.energy.close()
        for lim in self._limits.values():
            lim.limit.close()
            if lim.window is not None:
                lim.window.close()
        self._zones, self._limits, self._zone_limits = [], {}, {}
