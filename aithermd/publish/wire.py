"""D-Bus names, signatures and error names of ``io.github.aithermd.Daemon1``, and the typed shape of the
documents it sends.

Dependency-free on purpose: ``aithermctl`` imports this module (and only this one) from the daemon's
package. Documents travel as JSON strings (signature ``s``); :class:`SnapshotDoc` and :class:`HistoryDoc`
type them once for both ends, and :func:`check` holds a parsed document to its type (the daemon's tests
strictly, aithermctl on every document it reads). No ``from __future__ import annotations`` here: a
TypedDict's ``NotRequired`` members are only recognised from evaluated annotations.
"""

import functools
import math
from types import UnionType
from typing import (
    Any,
    Literal,
    NotRequired,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

BUS_NAME = "io.github.aithermd.Daemon1"
OBJECT_PATH = "/io/github/aithermd/Daemon1"
INTERFACE = "io.github.aithermd.Daemon1"

# polkit actions, one per privileged method family
ACTION_SET_POLICY = "io.github.aithermd.set-policy"
ACTION_HOLD_POLICY = "io.github.aithermd.hold-policy"
ACTION_OVERRIDE = "io.github.aithermd.override"
ACTION_RELOAD = "io.github.aithermd.reload"

# D-Bus error names
ERROR_PREFIX = "io.github.aithermd.Error"
ERROR_NOT_AUTHORIZED = f"{ERROR_PREFIX}.NotAuthorized"
ERROR_UNKNOWN_KNOB = f"{ERROR_PREFIX}.UnknownKnob"
ERROR_UNKNOWN_POLICY = f"{ERROR_PREFIX}.UnknownPolicy"
ERROR_OUT_OF_RANGE = f"{ERROR_PREFIX}.OutOfRange"
ERROR_INVALID_ARGUMENT = f"{ERROR_PREFIX}.InvalidArgument"
ERROR_UNKNOWN_COOKIE = f"{ERROR_PREFIX}.UnknownCookie"
ERROR_UNKNOWN_WINDOW = f"{ERROR_PREFIX}.UnknownWindow"
ERROR_WRONG_WINDOW = f"{ERROR_PREFIX}.WrongWindow"
ERROR_LIMIT_EXCEEDED = f"{ERROR_PREFIX}.LimitExceeded"
ERROR_POLICY_INVALID = f"{ERROR_PREFIX}.PolicyInvalid"
ERROR_BUSY = f"{ERROR_PREFIX}.Busy"
ERROR_STATE_NOT_SAVED = f"{ERROR_PREFIX}.StateNotSaved"

# Methods: name → (in signature, out signature). JSON documents are strings.
METHODS: dict[str, tuple[str, str]] = {
    "GetSnapshot": ("", "s"),  # JSON SnapshotDoc (below)
    "GetHistory": ("d", "s"),  # seconds → JSON HistoryDoc (below)
    "Explain": ("s", "s"),  # knob id ("" = all) → JSON {knob_id: {"value","requested","rule","reason","inputs"}}
    "ListPolicies": ("", "s"),  # JSON [{"name","path","description","active"}]
    # name → JSON {"name","path","source" (YAML text),"description","warnings" (what selects nothing here)}
    "GetPolicy": ("s", "s"),
    "StartEnergyWindow": ("sd", "t"),  # name, timeout_s (0 = one day) → window id
    "StopEnergyWindow": ("t", "s"),  # id → JSON {"id","name","duration_s","joules": {device_id: J},"total_j"}
    # name, timeout_s, scope ("job:N", "unit:NAME", "container:ID", "cgroup:/PATH", "pid:N", "") → window id
    "StartScopedEnergyWindow": ("sds", "t"),
    # id, name ("" = any; else it must match) → JSON as StopEnergyWindow + "scope","attributed","restarts"
    "StopEnergyWindowNamed": ("ts", "s"),
    "ListEnergyWindows": ("", "s"),  # JSON [window document so far], the caller's own (root: all)
    # JSON {"enabled","t_wall","interval_s","gpus": {gpuN: {"uuid","memory_used_bytes","memory_total_bytes",
    # "basis","idle_floor_w","processes_error","utilization_error","processes": [{"pid","user","command",
    # "comm","kinds","memory_bytes","sm_pct","watts","joules","visible","unit","job"?,"container"?}]}},
    # "processes": [{"pid","start","user","comm","command","alive","unit",...,"joules": {device: J},
    # "watts","basis","total_j"}], "groups": {"unit"|"job"|"container": {name: {device: J, "total_j",
    # "users"}}}, "devices": {device: {"total_j","idle_j","unattributed_j"}}}
    "GetProcesses": ("", "s"),
    # since (wall s), by ("unit"|"job"|"container"|"process"|"day") → JSON {"since","first_day","by",
    # "currency","cost_per_kwh","rows": [{"name","joules","total_j","kwh","cost"?,...}],"total","idle",
    # "unattributed"}
    "GetEnergyReport": ("ds", "s"),
    "SetActivePolicy": ("s", ""),
    "HoldPolicy": ("ssdb", "u"),  # policy, reason, timeout_s (0 = none), detached → cookie
    "ReleasePolicy": ("u", ""),
    # knob id, value (daemon units), seconds (0 = until cleared) → the value applied, warnings (a fan stopped
    # until cleared)
    "SetOverride": ("sdd", "das"),
    "ClearOverride": ("s", ""),
    "Reload": ("", ""),
    "ReleaseGpu": ("s", "s"),  # device id → what was done (its originals restored, no longer used)
    # gpus (device ids), rate (steps/s ≥ 0): a job's own progress, for 30 s. Privileged (hold-policy)
    "ReportProgress": ("asd", ""),
}

# Properties (read-only): name → signature
PROPERTIES: dict[str, str] = {
    "Version": "s",
    "ActivePolicy": "s",
    "Holds": "s",  # JSON [{"cookie","policy","reason","owner","detached","expires","uid","created"}]
    "PolicyStates": "s",  # JSON {policy: {scope: state}}
    "DegradedDevices": "as",
    "DryRun": "b",
}

# Signals: name → signature
SIGNALS: dict[str, str] = {
    "SnapshotUpdated": "t",  # seq; rate-limited
    "Event": "ss",  # kind ("decision"|"drift"|"fault"|"hotplug"|...), JSON of the event
}

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_NOT_AUTHORIZED = 4


# -- Documents --------------------------------------------------------------------------------------------
# The JSON documents of GetSnapshot and GetHistory, typed once for both ends: the daemon builds them
# (aithermd.publish.document, aithermd.publish.history), aithermctl reads them through :func:`snapshot_doc`
# and :func:`history_doc`. Values are in daemon units (°C, W, J, RPM, %, MHz, V, A, s); null where unknown.

StatusName = Literal["ok", "held", "failed", "implausible", "not_supported", "stale"]
DeviceKindName = Literal["hwmon", "powercap", "thermal", "cpu", "gpu"]
KnobKindName = Literal["pwm", "pl1", "pl2", "power_limit", "fan", "target_temperature", "epp", "governor", "boost",
                       "platform_profile", "sm_clock_lock"]
LayerName = Literal["safety", "override", "hold", "policy", "default"]
ModeName = Literal["full", "manual", "auto"]


class ChannelDoc(TypedDict):
    """One channel's reading this tick. ``label`` is the attribute when the source has none (as lm-sensors
    prints it), ``alias`` the name its driver documents when the label lacks it (``Tctl``), else null;
    ``value`` in ``unit``, null unless ``status`` is ok or ``held`` (the sensor trust carrying the last good
    value over a suspect read; stale may carry the last value); ``reason`` says why when the status is not
    ok (``"EIO: Input/output error"``), else null.
    ``thresholds`` (only when the source states any), in ``unit``: hwmon ``min``, ``max``, ``crit``,
    ``lcrit``, ``emergency``, ``cap``; NVML ``slowdown``, ``shutdown``, ``max_operating``. ``estimated``
    (true, only when so): the value is derived, not measured (a pre-Volta GPU's energy, from its power)."""

    id: str
    attribute: str
    label: str
    alias: str | None
    value: float | None
    unit: str
    status: StatusName
    reason: str | None
    thresholds: NotRequired[dict[str, float]]
    estimated: NotRequired[bool]


class FanDoc(TypedDict):
    """What ``aithermd fans detect``/``calibrate`` found for one pwm: the fan inputs that follow it (empty:
    nothing connected), the lowest duty that starts them from standstill and the lowest that keeps them
    turning (%; null until calibrated), each one's RPM at full, and how many levels its driver keeps (0:
    every one of 0–255)."""

    tachs: list[str]
    start_pct: float | None
    stop_pct: float | None
    max_rpm: dict[str, float]
    levels: int
    calibrated: bool


class AlarmDoc(TypedDict):
    """What needs a person about a knob or a fan input: ``kind`` ``conflict``, ``uncontrollable``,
    ``refused`` (a safety decision refused permission), ``stalled``, ``empty`` or ``blind`` (a fan input whose
    speed cannot be read at low duty, :mod:`aithermd.runtime.fanwatch`); since wall-clock ``since``."""

    kind: Literal["conflict", "uncontrollable", "refused", "stalled", "empty", "blind"]
    message: str
    since: float


class KnobDoc(TypedDict):
    """One knob: its read-back ``value`` and ``mode`` (pwm ``full``/``manual``/``auto``, NVML fans
    ``manual``/``auto``, null where the knob has none); its constraints; and this tick's winning decision
    (``requested``, ``reason``, ``rule``, ``layer``; null when no decision touched it)."""

    id: str
    kind: KnobKindName
    value: float | None
    unit: str
    min: float | None
    max: float | None
    default: float | None
    writable: bool
    why_not: str | None
    mode: ModeName | None
    requested: float | None
    reason: str | None
    rule: str | None
    layer: LayerName | None
    label: NotRequired[str | None]  # the admin's name (config ``names``)
    fan: NotRequired[FanDoc | None]  # pwm only: fan detection and calibration (null: paired by number)


class HeldIdleDoc(TypedDict):
    """A GPU held high while idle (:mod:`aithermd.policy.held`): W and s."""

    for_s: float  # since the daemon found it idle and high
    power_w: float  # its draw now
    floor_w: float  # its idle floor
    excess_w: float  # power_w - floor_w
    floor: Literal["learned", "assumed"]  # learned from its own idle, or a share of its default limit
    held_w: float  # its draw when found held
    recovered_w: float  # held_w - power_w: what a clock lock took off
    pstate: str | None


class DeviceAttrsDoc(TypedDict, total=False):
    """Non-numeric facts a device reports each tick (NVML GPUs)."""

    clock_event_reasons: list[str]  # NVML clock event reasons: "sw_power_cap", "hw_slowdown", "idle", ...
    persistence_mode: bool
    pstate: str  # "P0" … "P15"
    held_idle: HeldIdleDoc  # only while held high


class DeviceInfoDoc(TypedDict, total=False):
    """Who a GPU is, as NVML names it: what ``CUDA_VISIBLE_DEVICES`` may hold (an index or a UUID)."""

    index: int  # NVML's device index (CUDA's order only with CUDA_DEVICE_ORDER=PCI_BUS_ID)
    uuid: str  # "GPU-5e8b…"
    pci_bus_id: str  # "00000000:01:00.0"


class DeviceDoc(TypedDict):
    """RAPL zones also say what they are for totals: ``role`` (``package``, ``platform`` for psys, or the
    subzone's name), ``in_total`` false when no total counts them (a subzone, psys, an MMIO copy of a
    package, which also names the zone it copies in ``duplicate_of``)."""

    id: str
    kind: DeviceKindName
    name: str
    chip: NotRequired[str | None]  # hwmon only: the lm-sensors chip name ("nct6798-isa-0290")
    info: NotRequired[DeviceInfoDoc]  # GPUs only
    channels: list[ChannelDoc]
    knobs: list[KnobDoc]
    attrs: NotRequired[DeviceAttrsDoc]
    role: NotRequired[str | None]
    in_total: NotRequired[bool]
    duplicate_of: NotRequired[str]


class HoldDoc(TypedDict):
    """A held policy (also the ``Holds`` property): wall-clock ``created``/``expires`` (null: no timeout);
    ``owner`` the holder's D-Bus unique name, or "detached"."""

    cookie: int
    policy: str
    reason: str
    owner: str
    detached: bool
    expires: float | None
    uid: int | None
    created: float


class PolicyDoc(TypedDict):
    """The active policy, the holds on top of it (the last one is in force) and each policy's state per
    scope (``{"ai-training": {"gpu0": "training"}}``)."""

    active: str
    holds: list[HoldDoc]
    states: dict[str, dict[str, str]]


class SnapshotDoc(TypedDict):
    """``GetSnapshot``: the latest tick. ``t_wall`` and ``tick_s`` are null before the first tick;
    ``degraded`` holds the ids of failed channels and lost devices; ``processes`` is the ``GetProcesses``
    document as of the last accounting pass, where the daemon accounts energy (its shape is the one noted
    at ``GetProcesses`` above; not typed member by member here yet)."""

    seq: int
    t_wall: float | None
    tick_s: float | None
    dry_run: bool
    degraded: list[str]
    devices: list[DeviceDoc]
    policy: PolicyDoc
    processes: NotRequired[dict[str, Any]]
    # the sources' own state: "nvml" {"library": "up"|"down", "error", "reinits", "init_failures",
    # "expected", "present", "gpus": {id: {"state", "why", "uuid", "pci_bus_id", "next_check_s"}},
    # "released": {uuid: pci_bus_id}},
    # "power_limits" {knob: {"requested_w", "enforced_w", "capped_by", "above_s"}}
    health: NotRequired[dict[str, Any]]
    alarms: NotRequired[dict[str, AlarmDoc]]  # knob or fan channel id → alarm
    # the node power budget's split this tick, only while one is in force (aithermd.policy.power_budget):
    # "policy", "budget_w" (GPUs and CPU packages, W DC), "how", "wall_w" (W AC or null), "other_w",
    # "allotted_w", "drawn_w", "wall_drawn_w" (W AC estimate or null), "short_w" (only when it cannot hold),
    # "devices" {id: {"ask_w", "floor_w", "target_w", "allotted_w", "in_force_w", "drawn_w", "util_pct",
    # "state"}}
    budget: NotRequired[dict[str, Any]]


class HistoryDoc(TypedDict):
    """``GetHistory(seconds)``: one column per channel (``series``, readings in ``units``) and one per knob
    (``knobs``, read-back values in ``knob_units``), oldest first, aligned on ``t`` (wall s); null where a
    reading was not ok or the series did not exist yet. Channels and knobs are apart because their ids may
    be the same: NVML's ``gpu0/fan0`` is both the fan's speed reading and its duty knob."""

    t: list[float]
    series: dict[str, list[float | None]]
    units: dict[str, str]
    knobs: dict[str, list[float | None]]
    knob_units: dict[str, str]


class DocumentError(ValueError):
    """A document that does not have its schema's shape; ``path`` names the member (``devices[2].channels[0]
    .value``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or 'document'}: {message}")
        self.path = path


def snapshot_doc(doc: Any, *, strict: bool = False) -> SnapshotDoc:
    """``doc`` (parsed JSON) checked against :class:`SnapshotDoc` and returned as it is. Members a newer
    daemon added are accepted unless ``strict``. Raises :class:`DocumentError`."""
    return check(doc, SnapshotDoc, strict=strict)


def history_doc(doc: Any, *, strict: bool = False) -> HistoryDoc:
    """``doc`` checked against :class:`HistoryDoc` (see :func:`snapshot_doc`)."""
    return check(doc, HistoryDoc, strict=strict)


def check(value: Any, schema: Any, *, strict: bool = True, path: str = "") -> Any:
    """``value`` when it has the shape of ``schema`` (a TypedDict above, ``list[X]``, ``dict[str, X]``,
    ``X | None``, a ``Literal``, ``str``/``int``/``float``/``bool``/``Any``); else raises
    :class:`DocumentError`. ``strict``: a TypedDict member the schema does not name is an error too.
    JSON has one number type: an int is a float; a bool is neither."""
    origin = get_origin(schema)
    if schema is Any:
        return value
    if origin is Literal:
        if value not in get_args(schema):
            raise DocumentError(path, f"{value!r} is not one of {', '.join(map(repr, get_args(schema)))}")
        return value
    if origin in (Union, UnionType):
        for option in get_args(schema):
            if option is type(None) and value is None:
                return value
        if value is None:
            raise DocumentError(path, "null where a value is required")
        (option,) = [a for a in get_args(schema) if a is not type(None)]
        return check(value, option, strict=strict, path=path)
    if origin is list:
        if not isinstance(value, list):
            raise DocumentError(path, f"expected a list, got {_kind(value)}")
        (item,) = get_args(schema)
        for i, v in enumerate(value):
            check(v, item, strict=strict, path=f"{path}[{i}]")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise DocumentError(path, f"expected an object, got {_kind(value)}")
        _, item = get_args(schema)
        for k, v in value.items():
            check(v, item, strict=strict, path=f"{path}.{k}" if path else str(k))
        return value
    if is_typeddict(schema):
        if not isinstance(value, dict):
            raise DocumentError(path, f"expected an object, got {_kind(value)}")
        hints = _hints(schema)
        missing = [k for k in schema.__required_keys__ if k not in value]
        if missing:
            raise DocumentError(path, f"missing {', '.join(sorted(missing))}")
        if strict and (extra := sorted(set(value) - set(hints))):
            raise DocumentError(path, f"unknown member {', '.join(extra)}")
        for k, v in value.items():
            if k in hints:
                check(v, hints[k], strict=strict, path=f"{path}.{k}" if path else k)
        return value
    if schema is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    elif schema is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, schema)
    if not ok:
        if value is None:
            raise DocumentError(path, f"null where a {schema.__name__} is required")
        raise DocumentError(path, f"expected {schema.__name__}, got {_kind(value)} {value!r:.40}")
    return value


@functools.cache
def _hints(schema: Any) -> dict[str, Any]:
    return get_type_hints(schema)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
