"""Frozen data types shared by every layer: the project's vocabulary.

Ids are stable text, never the boot-dependent ``hwmonN`` number:

- devices: ``hwmon:<lm-sensors chip name>`` (``hwmon:k10temp-pci-00c3``), ``powercap:<zone name>``
  (``powercap:package-0``), ``cpu``, ``gpu<N>`` (NVML index; the UUID travels as ``Device.info["uuid"]``),
  ``thermal:<zone type>`` (``thermal:acpitz``).
  A second device with the same id gets ``#2`` appended (``powercap:core#2``).
- channels and knobs: ``<device id>/<name>``: ``hwmon:k10temp-pci-00c3/temp1``,
  ``hwmon:nct6798-isa-0290/pwm2``, ``powercap:package-0/pl1``, ``gpu0/power_limit``, ``gpu0/fan0``.

Units inside the daemon are °C, W, J, V, A, RPM, %, MHz and seconds; backends convert at their edge
(see :mod:`aithermd.units`). Data flows one way: sample → evaluate → actuate → publish.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return EMPTY


HELD = "held: "  # detail prefix of an ok reading whose value the sensor trust carried over a suspect read


class Status(StrEnum):
    """Health of one reading. ``not_supported`` is a capability, the others are health problems."""

    OK = "ok"
    FAILED = "failed"  # the read raised (EIO, ENODATA, ENXIO, EAGAIN, ENODEV, EACCES, NVML error, ...)
    IMPLAUSIBLE = "implausible"  # it read, but the value is nonsense (−128 °C, 65535 RPM, torn read)
    NOT_SUPPORTED = "not_supported"  # the device has no such capability
    STALE = "stale"  # no fresh value in time; the last one is carried


class DeviceKind(StrEnum):
    HWMON = "hwmon"
    POWERCAP = "powercap"
    CPU = "cpu"
    GPU = "gpu"
    THERMAL = "thermal"


class KnobKind(StrEnum):
    PWM = "pwm"  # hwmon pwmN, duty in %
    PL1 = "pl1"  # RAPL constraint_0 (long_term) power limit, W
    PL2 = "pl2"  # RAPL constraint_1 (short_term) power limit, W
    POWER_LIMIT = "power_limit"  # NVML power management limit, W
    FAN = "fan"  # NVML fan speed, duty in %
    TARGET_TEMPERATURE = "target_temperature"  # NVML acoustic threshold (GPU Target Temperature), °C
    EPP = "epp"  # cpufreq energy_performance_preference: an index into Knob.choices
    GOVERNOR = "governor"  # cpufreq scaling_governor: an index into Knob.choices
    BOOST = "boost"  # cpufreq boost / intel_pstate no_turbo: 0 off, 1 on
    PLATFORM_PROFILE = "platform_profile"  # ACPI platform_profile: an index into Knob.choices
    SM_CLOCK_LOCK = "sm_clock_lock"  # NVML locked SM clock range, its top in MHz (the card's top: unlocked)


class Quantity(StrEnum):
    """What a channel measures; each has one unit (see :data:`UNITS`)."""

    TEMPERATURE = "temperature"
    FAN = "fan"
    VOLTAGE = "voltage"
    CURRENT = "current"
    POWER = "power"
    ENERGY = "energy"
    UTILIZATION = "utilization"
    CLOCK = "clock"
    LOAD = "load"
    DUTY = "duty"


UNITS: Mapping[Quantity, str] = MappingProxyType({
    Quantity.TEMPERATURE: "°C",
    Quantity.FAN: "RPM",
    Quantity.VOLTAGE: "V",
    Quantity.CURRENT: "A",
    Quantity.POWER: "W",
    Quantity.ENERGY: "J",
    Quantity.UTILIZATION: "%",
    Quantity.CLOCK: "MHz",
    Quantity.LOAD: "",
    Quantity.DUTY: "%",
})


@dataclass(frozen=True, slots=True)
class Channel:
    """One readable input, described once at discovery.

    ``attribute`` is the source's own name (hwmon ``temp1``/``fan2``/``in0``/``power1``; GPU ``temperature``,
    ``memory_temperature``, ``power``, ``energy``, ``utilization``, ``memory_utilization``, ``sm_clock``,
    ``memory_clock``, ``fan0``; powercap ``power``/``energy``; cpu ``utilization``, ``cpu<N>``, ``load1``,
    ``frequency``). ``thresholds`` are in the channel's unit, keyed ``min``, ``max``, ``crit``, ``lcrit``,
    ``emergency``, ``cap`` (hwmon) or ``slowdown``, ``shutdown``, ``max_operating`` (NVML).
    ``alias`` is the name its driver documents for it when ``label`` (what lm-sensors shows) lacks it:
    ``Tctl`` for an unlabelled k10temp ``temp1`` (:mod:`aithermd.backends.labels`); selectors match both.
    ``estimated``: the value is derived, not measured (a pre-Volta GPU's energy integrated from its power
    draw).
    """

    id: str
    device_id: str
    attribute: str
    quantity: Quantity
    unit: str
    label: str | None = None
    thresholds: Mapping[str, float] = field(default_factory=_empty)
    alias: str | None = None
    estimated: bool = False


EDGE_MARGIN = 0.1  # Knob.edge_margin: the fraction of a knob's range a request may overshoot and be clamped


@dataclass(frozen=True, slots=True)
class FanCalibration:
    """What fan detection and calibration (:mod:`aithermd.fans`) found for one pwm knob: ``tachs`` the fans
    that follow it (empty: none connected); ``start_pct``/``stop_pct`` the lowest duty that starts them from
    standstill / keeps them turning; ``rpm`` per tach, (duty %, RPM) by rising duty; ``levels`` the raw
    ``pwmN`` values its driver keeps (empty: all); ``calibrated``: measured (detection gives ``tachs``)."""

    tachs: tuple[str, ...] = ()
    start_pct: float | None = None
    stop_pct: float | None = None
    rpm: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=_empty)
    levels: tuple[int, ...] = ()
    calibrated: bool = False


@dataclass(frozen=True, slots=True)
class Knob:
    """One actuator, with its constraints decided at discovery (never re-probed per tick).

    ``value`` units: pwm and fan duty in %, limits in W, SM clock locks in MHz. ``writable`` False carries
    ``why_not`` (e.g. "NVML_ERROR_NO_PERMISSION: needs root", "no pwm1_enable and pwm1 not writable").
    ``fan_channel`` is the channel id that measures this fan's speed, when known. ``choices``: the names
    of an enumerated knob (EPP, governor, boost, platform_profile), whose value is an index into them.
    ``label``: the admin's name for it (config ``names``); ``fan``: its fan detection and calibration.
    """

    id: str
    device_id: str
    kind: KnobKind
    unit: str
    min: float | None = None
    max: float | None = None
    default: float | None = None
    writable: bool = False
    why_not: str | None = None
    fan_channel: str | None = None
    choices: tuple[str, ...] = ()
    label: str | None = None
    fan: FanCalibration | None = None

    def clamp(self, value: float) -> float:
        """``value`` clamped to [min, max] (each bound only when known)."""
        if self.min is not None and value < self.min:
            value = self.min
        if self.max is not None and value > self.max:
            value = self.max
        return value

    def edge_margin(self) -> float:
        """How far beyond a bound an operator's request is still clamped rather than refused: a tenth of the
        range (of the bound when only one is known), at least one unit (450 W max: up to 480 W of a 150–450 W
        range gives 450 W; a duty of 103 % gives 100 %)."""
        if self.min is not None and self.max is not None:
            span = self.max - self.min
        else:
            span = abs(self.max if self.max is not None else self.min or 0.0)
        return max(EDGE_MARGIN * span, 1.0)


@dataclass(frozen=True, slots=True)
class Device:
    """A device owned by exactly one backend. ``info`` holds text fields (uuid, pci_bus_id, adapter, ...)."""

    id: str
    kind: DeviceKind
    name: str
    channels: tuple[Channel, ...] = ()
    knobs: tuple[Knob, ...] = ()
    chip: str | None = None  # hwmon only: the bare lm-sensors chip name
    info: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Reading:
    """One channel's value this tick, in the channel's unit, or None with a non-ok status."""

    channel_id: str
    value: float | None
    status: Status = Status.OK
    detail: str | None = None  # why it failed ("EIO", "NVML_ERROR_GPU_IS_LOST", "−128 °C out of range")


@dataclass(frozen=True, slots=True)
class KnobValue:
    """A knob's present setting as read back: ``value`` in daemon units, ``mode`` where the knob has one
    (pwm: ``"full"``, ``"manual"``, ``"auto"`` from ``pwmN_enable`` 0/1/≥2, None if the driver has no
    ``pwmN_enable``; GPU fan: ``"manual"``/``"auto"``), ``extra`` for related values (GPU
    ``enforced_w``)."""

    knob_id: str
    value: float | None
    mode: str | None = None
    status: Status = Status.OK
    extra: Mapping[str, float] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Sample:
    """What one backend read in one pass: every channel and knob of its devices, each file once.

    ``t`` is the monotonic time of the read; ``attrs`` holds non-numeric per-tick facts per device
    (GPU ``clock_event_reasons``: tuple of names, ``persistence_mode``: bool, ``pstate``); ``lost`` the ids
    of devices that vanished (GPU_IS_LOST, ENODEV on every file); ``health`` the source's own state by
    family (``{"nvml": {"library": "up", "expected": 2, "present": 1, ...}}``).
    """

    t: float
    readings: Mapping[str, Reading] = field(default_factory=_empty)
    knobs: Mapping[str, KnobValue] = field(default_factory=_empty)
    attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)
    lost: frozenset[str] = frozenset()
    health: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)


class Layer(StrEnum):
    """Arbitration layers, strongest first: safety > override > hold > policy > default."""

    SAFETY = "safety"
    OVERRIDE = "override"
    HOLD = "hold"
    POLICY = "policy"
    DEFAULT = "default"  # hand the knob back: restore what was found


LAYER_RANK: Mapping[Layer, int] = MappingProxyType({
    Layer.SAFETY: 0, Layer.OVERRIDE: 1, Layer.HOLD: 2, Layer.POLICY: 3, Layer.DEFAULT: 4,
})


@dataclass(frozen=True, slots=True)
class Decision:
    """What one knob should be, and why.

    ``value`` is in daemon units after clamping to the knob's constraints (None with layer DEFAULT means
    "give the knob back": restore the journaled original). ``requested`` is the value before clamping.
    ``rule`` is ``"<policy>/<rule>"``, ``"safety/<reason>"`` or ``"override"``; ``reason`` a readable
    sentence; ``inputs`` the inputs and window statistics that decided it.
    """

    knob_id: str
    value: float | None
    layer: Layer
    rule: str
    reason: str = ""
    requested: float | None = None
    inputs: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Hold:
    """A policy held on top of the active one (D-Bus HoldPolicy); times are wall-clock seconds."""

    cookie: int
    policy: str
    reason: str
    owner: str  # D-Bus unique name or "detached"
    uid: int | None = None
    created: float = 0.0
    expires: float | None = None
    detached: bool = False


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """``active`` policy name, the ``holds`` on top (last wins), and per policy the state of each state
    machine (``{"ai-training": {"gpu0": "training"}}``)."""

    active: str = ""
    holds: tuple[Hold, ...] = ()
    states: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Alarm:
    """A knob or fan that needs a person: ``kind`` ``conflict`` (another writer), ``uncontrollable`` (refused
    or its chip mute), ``refused`` (a safety write), ``stalled``, ``empty``, ``blind``; ``since``: s."""

    kind: str
    message: str
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    """A decision, drift, fault or hotplug, for logs, D-Bus ``Event`` and the TUI."""

    kind: str  # "actuation" | "drift" | "conflict" | "fault" | "hotplug" | "policy" | "restore"
    t_wall: float
    subject: str  # knob, channel or device id
    message: str
    data: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The frozen result of one tick: the only input of D-Bus, Prometheus and the TUI."""

    seq: int
    t_mono: float
    t_wall: float
    devices: tuple[Device, ...] = ()
    readings: Mapping[str, Reading] = field(default_factory=_empty)
    knobs: Mapping[str, KnobValue] = field(default_factory=_empty)
    attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)
    decisions: Mapping[str, Decision] = field(default_factory=_empty)  # the winning decision per knob this tick
    policy: PolicyStatus = field(default_factory=PolicyStatus)
    degraded: tuple[str, ...] = ()  # device, channel or knob ids in trouble
    dry_run: bool = False
    tick_s: float = 1.0
    health: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)  # the sources' own state by
    # family (NVML library and GPUs expected/present, the udev monitor), as the backends' samples had it
    budget: Mapping[str, Any] = field(default_factory=_empty)  # how the power budget was split (power_budget)
    alarms: Mapping[str, Alarm] = field(default_factory=_empty)  # knob or fan channel id → alarm


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a GPU, as NVML lists it (``nvmlDeviceGetComputeRunningProcesses``/``Graphics``):
    ``kinds`` ``"C"``, ``"G"`` or ``"C+G"``; ``used_memory_bytes`` None where NVML cannot tell
    (NVML_VALUE_NOT_AVAILABLE); MIG instance ids None with MIG off. The pid is the host's (NVML does not
    know PID namespaces)."""

    pid: int
    kinds: str = "C"
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """One process's utilization of one GPU since the previous read (``nvmlDeviceGetProcessUtilization``):
    ``sm_pct``/``memory_pct``/``encoder_pct``/``decoder_pct`` the mean of its samples (%), ``busy`` the sum
    over its samples of SM + encoder + decoder % (the weight energy is shared by), ``samples`` their
    number. A process without samples had zero utilization (the driver only samples busy processes)."""

    sm_pct: float
    memory_pct: float
    encoder_pct: float
    decoder_pct: float
    busy: float
    samples: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """Who used one GPU, read at the accounting cadence (not every tick).

    ``processes``: the GPU's processes (None when the list could not be read: ``error`` says why);
    ``utilization``: per pid since the previous read, or None where the driver gives none (MIG,
    NOT_SUPPORTED: ``utilization_error``); an empty mapping means "supported, no process was busy".
    Memory in bytes (``nvmlDeviceGetMemoryInfo``), None when unreadable."""

    device_id: str
    uuid: str | None = None
    processes: tuple[GpuProcess, ...] | None = ()
    utilization: Mapping[int, ProcessUtilization] | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    error: str | None = None
    utilization_error: str | None = None


def in_total(device: Device) -> bool:
    """Whether ``device``'s energy and power count in a total (CPU package power, energy windows): GPUs and
    RAPL packages do; a RAPL subzone (core, uncore, dram: inside its package), the platform zone (psys) and
    a second copy of a package (``intel-rapl-mmio``) do not (``info["in_total"]``, set by the backend)."""
    return bool(device.info.get("in_total", True))


def is_cpu_package(device: Device) -> bool:
    """A CPU package counted once: a RAPL ``package-N`` zone (or an AMD socket energy counter) that is no
    copy of another."""
    role = device.info.get("role")
    if role is None:  # a device described without roles: a top-level zone named package-N
        role = "package" if device.name.startswith("package") and not device.info.get("parent") else None
    return device.kind is DeviceKind.POWERCAP and role == "package" and in_total(device)
