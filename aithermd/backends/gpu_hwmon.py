"""AMD and Intel GPUs through their hwmon chips (amdgpu, xe, i915), as ``gpu<N>`` devices in NVML's words.

Sources: the kernel's amdgpu hwmon documentation (Documentation/gpu/amdgpu/thermal.rst), the xe and i915
hwmon ABI (Documentation/ABI/testing/sysfs-driver-intel-xe-hwmon, sysfs-driver-intel-i915-hwmon), the
hwmon sysfs ABI; and the recorded amdgpu trees of RX 6900 XT, 7900 XTX and 9070 XT (LACT's snapshots).

Discovery finds ``class/hwmon/hwmon*`` whose ``name`` is one of :data:`GPU_DRIVERS` (the
:class:`~aithermd.backends.hwmon.HwmonBackend` leaves those chips to this backend) and numbers the cards
``gpu<index_base + k>`` in PCI address order: NVIDIA GPUs keep NVML's numbers, these follow them
(:mod:`aithermd.backends.registry` sets ``index_base``); a card keeps its number when another vanishes. The same vocabulary as NVML's devices:

- ``temperature``: amdgpu ``edge`` (else ``junction``), xe/i915 ``pkg`` (else the first); thresholds
  ``slowdown`` ← ``crit`` (amdgpu: the SMU throttles there) and ``shutdown`` ← ``emergency``, so the safety
  layer reads them as it reads NVML's; ``junction_temperature`` (amdgpu hot spot),
  ``memory_temperature`` (amdgpu ``mem``, xe ``vram``);
- ``power`` (W): ``power1_input``, else ``power1_average`` (the PPT average the cap governs), as lm-sensors
  and the hwmon backend read it;
  ``energy`` (J): ``energy1_input`` (xe, i915; amdgpu has none);
- ``utilization``/``memory_utilization`` (%): the PCI device's ``gpu_busy_percent``/``mem_busy_percent``;
- ``sm_clock``/``memory_clock`` (MHz): ``freq1_input``/``freq2_input`` (Hz; amdgpu ``sclk``/``mclk``);
  ``voltage``, ``voltage1`` … (V): ``in0_input`` (amdgpu ``vddgfx``), ``in1_input`` (APUs: ``vddnb``);
- ``fan0`` (duty %, from ``pwm1``) and ``fan0_rpm`` (``fan1_input``);
- knob ``power_limit`` (W): amdgpu ``power1_cap`` with ``power1_cap_min``/``_max``/``_default`` (a
  minimum of 0 — amdgpu before its SMU reported one — is taken as unknown); xe/i915 ``power1_max`` (card;
  ``power2_max``, the package limit, when there is no card limit), default ``power1_rated_max``. amdgpu
  takes whole watts: the read-back shows the rounding;
- knob ``fan0`` (duty %): ``pwm1`` with ``pwm1_enable`` (:class:`~aithermd.backends.pwm.PwmKnob`). An
  amdgpu without ``pwm1_enable`` (RDNA4: the firmware owns the fan, curves only through ``gpu_od``) is
  read-only.

``info``: ``pci_bus_id``, ``driver``, ``name`` (the PCI id as ``AMD 1002:744c``), ``hwmon``, ``uuid``
(amdgpu ``unique_id`` where the card has one). Saved knob states carry the PCI address, so ``aithermd
restore`` puts a limit back on the same card whatever number it has now.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

from aithermd import units
from aithermd.backends.fast import ok_reading
from aithermd.backends.gpu_hwmon_pci import pci_id as _pci_id
from aithermd.backends.plausible import DIE_FLOOR_C
from aithermd.backends.pwm import PwmKnob
from aithermd.backends.readers import HwmonReader
from aithermd.backends.saved_limits import checked_uw
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
from aithermd.errors import BackendError, NoPermission, NotSupported, OutOfRange, UnknownKnob
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

GPU_DRIVERS = frozenset({"amdgpu", "xe", "i915"})
VENDORS = {"0x1002": "AMD", "0x8086": "Intel"}
PLAUSIBLE = {Quantity.TEMPERATURE: (DIE_FLOOR_C, 200.0), Quantity.POWER: (0.0, 5000.0),
             Quantity.ENERGY: (0.0, 1e18),
             Quantity.UTILIZATION: (0.0, 100.0), Quantity.CLOCK: (0.0, 100_000.0), Quantity.FAN: (0.0, 50_000.0),
             Quantity.VOLTAGE: (0.0, 10.0), Quantity.DUTY: (0.0, 100.0)}
TEMP_ROLES = {"edge": "temperature", "junction": "junction_temperature", "mem": "memory_temperature",
              "pkg": "temperature", "vram": "memory_temperature"}


@dataclass
class _Input:
    channel: Channel
    attr: Attribute
    convert: Any


@dataclass
class _Card:
    id: str
    pci: str
    driver: str
    hwmon_dir: str
    device_dir: str
    inputs: list[_Input] = field(default_factory=list)
    cap: tuple[Knob, Attribute] | None = None
    fan: PwmKnob | None = None


def _hz_to_mhz(hz: float) -> float:
    return hz / 1e6


class HwmonGpuBackend:
    """amdgpu/xe/i915 GPUs under ``sysfs_root`` (see the module doc); ``io`` is the file-access seam."""

    kind = "hwmon-gpu"

    def __init__(self, sysfs_root: str = "/sys", io: SysfsIO | None = None, clock: Clock | None = None,
                 index_base: int = 0) -> None:
        self.sysfs_root = sysfs_root
        self.io = io or SysfsIO()
        self.clock = clock or RealClock()
        self.index_base = index_base
        self._cards: list[_Card] = []
        self._knobs: dict[str, _Card] = {}
        self._ids: dict[str, str] = {}  # PCI address → gpuN, kept across rediscoveries

    # -- discovery -------------------------------------------------------------------------------------
    def _found(self) -> list[tuple[str, str, str, str]]:
        """(pci address, driver, hwmon dir, device dir) of every GPU hwmon chip, in PCI address order."""
        io = self.io
        class_dir = os.path.join(self.sysfs_root, "class", "hwmon")
        try:
            names = io.listdir(class_dir)
        except OSError:
            return []
        out = []
        for n in names:
            hwmon = os.path.join(class_dir, n)
            driver = read_optional_text(io, os.path.join(hwmon, "name"))
            if driver is None:  # no name: the driver bound to its device, as the hwmon backend names it
                driver = os.path.basename(io.realpath(os.path.join(hwmon, "device", "driver")))
            if driver not in GPU_DRIVERS:
                continue
            device = io.realpath(os.path.join(hwmon, "device"))
            out.append((os.path.basename(device), driver, io.realpath(hwmon), device))
        return sorted(out)

    def discover(self) -> list[Device]:
        """The cards present now. A card keeps the id it was first given for the life of this instance (a
        rediscovery after another card vanished renumbers nothing), and a vanished card's id is not given
        to another one; a card that comes back gets its id back."""
        self.close()
        devices = []
        taken = set(self._ids.values())
        n = self.index_base
        for pci, driver, hwmon, device in self._found():
            if pci not in self._ids:
                while f"gpu{n}" in taken:
                    n += 1
                self._ids[pci] = f"gpu{n}"
                taken.add(self._ids[pci])
            card = _Card(self._ids[pci], pci, driver, hwmon, device)
            devices.append(self._build(card))
            self._cards.append(card)
        return devices

    def _channel(self, card: _Card, attribute: str, quantity: Quantity, path: str, convert: Any,
                 label: str | None = None, thresholds: dict[str, float] | None = None) -> None:
        ch = Channel(f"{card.id}/{attribute}", card.id, attribute, quantity, UNITS[quantity], label,
                     thresholds or {})
        card.inputs.append(_Input(ch, Attribute(self.io, path), convert))

    def _build(self, card: _Card) -> Device:
        io, hw = self.io, card.hwmon_dir
        files = set(io.listdir(hw))

        def num(name: str) -> int | None:
            return read_optional_int(io, os.path.join(hw, name)) if name in files else None

        for n in range(1, 8):
            if f"temp{n}_input" not in files:
                continue
            label = read_optional_text(io, os.path.join(hw, f"temp{n}_label")) if f"temp{n}_label" in files else None
            role = TEMP_ROLES.get(label or "", f"temp{n}_temperature")
            if any(i.channel.attribute == role for i in card.inputs):
                role = f"temp{n}_temperature"
            th = {key: units.mc_to_c(v) for key, name in (("slowdown", "crit"), ("shutdown", "emergency"))
                  if (v := num(f"temp{n}_{name}")) is not None and 0 < v < 200_000}
            self._channel(card, role, Quantity.TEMPERATURE, os.path.join(hw, f"temp{n}_input"), units.mc_to_c,
                          label, th)
        if not any(i.channel.attribute == "temperature" for i in card.inputs):
            first = next((i for i in card.inputs if i.channel.quantity == Quantity.TEMPERATURE), None)
            if first is not None:  # no edge or pkg label: the first sensor stands for the GPU
                first.channel = Channel(f"{card.id}/temperature", card.id, "temperature", Quantity.TEMPERATURE,
                                        "°C", first.channel.label, first.channel.thresholds)
        def label(name: str) -> str | None:
            return read_optional_text(io, os.path.join(hw, name)) if name in files else None

        power = next((f"power1_{s}" for s in ("input", "average") if f"power1_{s}" in files), None)
        if power is not None:
            self._channel(card, "power", Quantity.POWER, os.path.join(hw, power), units.uw_to_w,
                          label("power1_label"))
        if "energy1_input" in files:
            self._channel(card, "energy", Quantity.ENERGY, os.path.join(hw, "energy1_input"), units.uj_to_j)
        for attribute, name in (("utilization", "gpu_busy_percent"), ("memory_utilization", "mem_busy_percent")):
            if io.exists(os.path.join(card.device_dir, name)):
                self._channel(card, attribute, Quantity.UTILIZATION, os.path.join(card.device_dir, name), float)
        for attribute, name in (("sm_clock", "freq1_input"), ("memory_clock", "freq2_input")):
            if name in files:
                self._channel(card, attribute, Quantity.CLOCK, os.path.join(hw, name), _hz_to_mhz)
        for n in range(0, 4):
            if f"in{n}_input" in files:
                self._channel(card, "voltage" if n == 0 else f"voltage{n}", Quantity.VOLTAGE,
                              os.path.join(hw, f"in{n}_input"), units.mv_to_v, label(f"in{n}_label"))
        knobs = self._power_knob(card, files, num)
        if "fan1_input" in files:
            self._channel(card, "fan0_rpm", Quantity.FAN, os.path.join(hw, "fan1_input"), float)
        if "pwm1" in files:
            knobs.append(self._fan_knob(card, files))
        vendor = VENDORS.get((read_optional_text(io, os.path.join(card.device_dir, "vendor")) or "").lower(),
                             "AMD" if card.driver == "amdgpu" else "Intel")
        pci_id = _pci_id(io, card.device_dir)
        name = f"{vendor} GPU {pci_id}" if pci_id else f"{vendor} GPU ({card.pci})"
        info = {"pci_bus_id": card.pci, "driver": card.driver, "hwmon": os.path.basename(hw), "name": name}
        uid = read_optional_text(io, os.path.join(card.device_dir, "unique_id"))
        if uid:
            info["uuid"] = uid
        return Device(card.id, DeviceKind.GPU, name, tuple(i.channel for i in card.inputs), tuple(knobs),
                      info=info)

    def _power_knob(self, card: _Card, files: set[str], num: Any) -> list[Knob]:
        hw = card.hwmon_dir
        if card.driver == "amdgpu":
            if "power1_cap" not in files:
                return []
            name, lo, hi, default = "power1_cap", num("power1_cap_min"), num("power1_cap_max"), \
                num("power1_cap_default")
        else:
            name = next((n for n in ("power1_max", "power2_max") if n in files), None)
            if name is None:
                return []
            prefix = name.split("_")[0]
            lo, hi, default = None, None, num(f"{prefix}_rated_max")
        why = why_not_writable(self.io, os.path.join(hw, name))

        def watts(uw: int | None) -> float | None:
            return units.uw_to_w(uw) if uw else None  # 0: not known (amdgpu before its SMU reported one)

        knob = Knob(f"{card.id}/power_limit", card.id, KnobKind.POWER_LIMIT, "W", watts(lo), watts(hi),
                    watts(default), why is None, None if why is None else f"{name} not writable ({why})")
        card.cap = (knob, Attribute(self.io, os.path.join(hw, name)))
        self._knobs[knob.id] = card
        return [knob]

    def _fan_knob(self, card: _Card, files: set[str]) -> Knob:
        hw = card.hwmon_dir
        enable = Attribute(self.io, os.path.join(hw, "pwm1_enable")) if "pwm1_enable" in files else None
        why = why_not_writable(self.io, os.path.join(hw, "pwm1"))
        if why is None and enable is None and card.driver == "amdgpu":
            why = "amdgpu without pwm1_enable: the firmware owns the fan (curves only through gpu_od/fan_ctrl)"
        elif why is not None:
            why = f"pwm1 not writable ({why})"
        knob = Knob(f"{card.id}/fan0", card.id, KnobKind.FAN, "%", 0.0, 100.0, writable=why is None, why_not=why,
                    fan_channel=f"{card.id}/fan0_rpm" if "fan1_input" in files else None)
        card.fan = PwmKnob(knob, Attribute(self.io, os.path.join(hw, "pwm1")), enable, card.driver)
        self._knobs[knob.id] = card
        ch = Channel(f"{card.id}/fan0", card.id, "fan0", Quantity.DUTY, "%")
        card.inputs.append(_Input(ch, card.fan.pwm, units.pwm_to_pct))
        return knob

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        lost = set()
        for card in self._cards:
            gone = 0
            for inp in card.inputs:
                cid = inp.channel.id
                try:
                    raw = inp.attr.read()
                    value = inp.convert(int(raw))
                except OSError as exc:
                    status, detail = classify_oserror(exc)
                    readings[cid] = Reading(cid, None, status, detail)
                    gone += exc.errno in (errno.ENOENT, errno.ENODEV)
                    continue
                except ValueError:
                    readings[cid] = Reading(cid, None, Status.IMPLAUSIBLE, f"not a number {raw[:32]!r}")
                    continue
                lo, hi = PLAUSIBLE.get(inp.channel.quantity, (0.0, 100.0))
                readings[cid] = ok_reading(cid, value) if lo <= value <= hi else Reading(
                    cid, None, Status.IMPLAUSIBLE, f"{value:g} {inp.channel.unit} out of range")
            if card.inputs and gone == len(card.inputs):
                lost.add(card.id)
            for kid in (k for k, c in self._knobs.items() if c is card):
                knobs[kid] = self.read_knob(kid)
        return Sample(t=t, readings=readings, knobs=knobs, lost=frozenset(lost))

    def reader(self, channel_id: str) -> HwmonReader | None:
        """A reader of one temperature through a descriptor of its own (the fast lane)."""
        for card in self._cards:
            for inp in card.inputs:
                if inp.channel.id == channel_id and inp.channel.quantity == Quantity.TEMPERATURE:
                    lo, hi = PLAUSIBLE[Quantity.TEMPERATURE]  # as sample() judges it
                    return HwmonReader(channel_id, Attribute(self.io, inp.attr.path), inp.convert,
                                       lambda value: lo <= value <= hi)
        return None

    # -- knobs -----------------------------------------------------------------------------------------
    def _card(self, knob_id: str) -> _Card:
        card = self._knobs.get(knob_id)
        if card is None:
            raise UnknownKnob(knob_id)
        return card

    def pwm_knob(self, knob_id: str) -> PwmKnob:
        """The card fan ``knob_id``'s :class:`PwmKnob`, as :meth:`HwmonBackend.pwm_knob`: what it learnt of
        its driver (``levels.lagging``: amdgpu's ``pwm1`` reads the ramping output; ``settles_at``;
        ``mode_refused``), asked by the applier and the rescue. Raises UnknownKnob (a power limit too)."""
        card = self._knobs.get(knob_id)
        if card is None or card.fan is None or card.fan.knob.id != knob_id:
            raise UnknownKnob(knob_id)
        return card.fan

    def read_knob(self, knob_id: str) -> KnobValue:
        card = self._card(knob_id)
        if knob_id.endswith("/fan0") and card.fan is not None:
            return card.fan.read()
        knob, attr = card.cap  # type: ignore[misc]
        try:
            return KnobValue(knob_id, units.uw_to_w(attr.read_int()))
        except OSError as exc:
            return KnobValue(knob_id, None, None, classify_oserror(exc)[0])
        except Nonsense:
            return KnobValue(knob_id, None, None, Status.IMPLAUSIBLE)

    def write_knob(self, knob_id: str, value: float) -> None:
        """Set the power limit (W; amdgpu keeps whole watts) or the fan duty (%, manual mode first). Raises
        OutOfRange, NoPermission, DeviceLost or BackendError."""
        card = self._card(knob_id)
        fan = card.fan if knob_id.endswith("/fan0") else None
        knob = fan.knob if fan is not None else card.cap[0]  # type: ignore[index]
        if not knob.writable:  # a firmware-owned fan (RDNA4) or a file root may not write
            raise (NoPermission if "not writable" in (knob.why_not or "") else NotSupported)(
                f"{knob_id} is read-only: {knob.why_not}")
        if fan is not None:
            fan.write(value)
            return
        knob, attr = card.cap  # type: ignore[misc]
        if value != value or value <= 0 or knob.clamp(value) != value:
            raise OutOfRange(f"{knob_id}: {value:g} W outside [{knob.min}, {knob.max}] W")
        try:
            attr.write_int(units.w_to_uw(value))
        except OSError as exc:
            raise write_error(exc, f"{knob_id} := {value:g} W") from exc

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """The original in hwmon units with the card's PCI address: ``{"pci", "cap_uw"}`` or ``{"pci",
        "pwm", "enable"}``."""
        card = self._card(knob_id)
        if knob_id.endswith("/fan0") and card.fan is not None:
            return {"pci": card.pci, **card.fan.save()}
        try:
            return {"pci": card.pci, "cap_uw": card.cap[1].read_int()}  # type: ignore[index]
        except OSError as exc:
            raise write_error(exc, f"{knob_id}: cannot read the original") from exc
        except Nonsense as exc:
            raise BackendError(f"{knob_id}: cannot read the original: {exc}") from exc

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> str | None:
        """Put ``saved`` back on the card at its PCI address (the id may have moved), else on ``knob_id``; a
        fan by the pwm rules (:mod:`aithermd.backends.pwm_restore`), with their note."""
        card = next((c for c in self._cards if c.pci == saved.get("pci")), None) or self._card(knob_id)
        what = knob_id.rsplit("/", 1)[1]
        if what == "fan0":
            if card.fan is None:
                raise UnknownKnob(knob_id)
            return card.fan.restore({k: v for k, v in saved.items() if k != "pci"})
        if card.cap is None:
            raise UnknownKnob(knob_id)
        try:
            card.cap[1].write_int(checked_uw(card.cap[0], "cap_uw", saved.get("cap_uw")))  # G3: no garbage
        except OSError as exc:
            raise write_error(exc, f"{knob_id}: restore {saved['cap_uw']} µW") from exc
        return None

    def locator(self) -> dict[str, Any]:
        return {"backend": "hwmon-gpu", "sysfs_root": self.sysfs_root}

    def close(self) -> None:
        for card in self._cards:
            for inp in card.inputs:
                inp.attr.close()
            if card.cap is not None:
                card.cap[1].close()
            if card.fan is not None:
                card.fan.close()
        self._cards, self._knobs = [], {}

