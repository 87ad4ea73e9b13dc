"""The policy language as pydantic v2 models: closed, typed data (unknown keys are errors).

A policy file is one YAML mapping (see ``policies/README.md``)::

    description: text
    safety:   {margin_c, gpu_temp_limit_c}       # can only make the built-in safety stricter
    curves:   {NAME: Curve}                      # fan curves, by kind: points | pid | mix
    machines: {NAME: Machine}                    # state machines with hysteresis (one per GPU or one)
    rules:    [Rule]             # kind: gpu_power_limit | gpu_clocks | cpu_power_limit | cpu_knobs | fan
    budget, quiet, timezone, holidays, schedules # the whole machine (aithermd.policy.schema_machine)

Rules, curves and sources are tagged unions on ``kind``; conditions are tagged by their one key (``metric``,
``all``, ``any``, ``not``, ``schedule``, ``process``, ``state``). Cross references (curve names, states,
cycles in ``mix``) are checked by :func:`aithermd.policy.references.check_references`. Units: °C, W, %, s.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from aithermd.policy import kinds, schema_machine
from aithermd.policy.schema_machine import (DAY_WORDS, Budget, CpuKnobsRule, Holidays, Quiet, ScheduleName,
                                            TimeZone)
from aithermd.policy.values import (BUILTIN_MARGIN_C, DAYS, HHMM, Globs, Ints, Model, Name, NonNeg, Pct,
                                    PowerValue, SmoothingS, Source, SourceAgg, SourceInput, WindowS,
                                    one_or_list, parse_power)

__all__ = ["BUILTIN_MARGIN_C", "DAYS", "Source", "SourceAgg", "SourceInput", "parse_power"]

# ----- selectors -------------------------------------------------------------------------------------
class GpuMatch(Model, kinds.GpuMatch):
    """GPUs by NVML index, UUID or model name pattern (fnmatch, case-insensitive); all given keys must match.
    No key at all (``gpus: all``) selects every GPU."""

    index: Ints | None = None
    uuid: Globs | None = None
    model: Globs | None = None


def _gpu_shortcut(value: Any) -> Any:
    if value == "all":
        return {}
    if isinstance(value, int | list) and not isinstance(value, bool):
        return {"index": value}
    if isinstance(value, str):
        raise ValueError(f"'{value}' is not a GPU selector: use all, an index, a list of indexes or "
                         "{index: ..., uuid: ..., model: ...}")
    return value


GpuSelector = Annotated[GpuMatch, BeforeValidator(
    _gpu_shortcut, json_schema_input_type=Literal["all"] | int | list[int] | GpuMatch)]


class FanMatch(Model, kinds.FanMatch):
    """Fans (hwmon ``pwmN`` and GPU ``fanN`` knobs) by knob id, hwmon chip, or label: the name the admin gave
    the fan (config ``names``) or its fan channel's label (fnmatch patterns); all given keys must match."""

    id: Globs | None = None
    chip: Globs | None = None
    label: Globs | None = None


# ----- conditions ------------------------------------------------------------------------------------
METRICS: Mapping[str, str] = MappingProxyType({
    "gpu.utilization_pct": "GPU utilization, %",
    "gpu.memory_utilization_pct": "GPU memory-controller utilization, %",
    "gpu.power_w": "GPU power draw, W",
    "gpu.power_pct": "GPU power draw as % of its present power limit",
    "gpu.temperature_c": "GPU temperature, °C",
    "gpu.memory_temperature_c": "GPU memory (HBM/GDDR) temperature, °C",
    "gpu.held_idle_w": "W a GPU with no work draws above its idle floor while held high for a minute "
                       "(a process holding a context, a stuck P-state), 0 otherwise",
    "cpu.utilization_pct": "CPU utilization (all cores), %",
    "cpu.power_w": "CPU package power (sum of RAPL package zones), W",
    "temperature_c": "a temperature channel named by `sensor` (id or label pattern; several → max), °C",
})
Metric = Literal[tuple(METRICS)]  # type: ignore[valid-type]


class CondBase(Model):
    sustain_s: NonNeg = Field(0.0, description="the condition must have held this long (s)")


class MetricCondition(CondBase, kinds.MetricCondition):
    """``metric`` against a threshold as ``stat`` (mean/min/max, time-weighted) over ``window_s``.

    ``above: X`` holds when the statistic is ≥ X, ``below: X`` when it is < X. A window holds only once it is
    full; an unknown value (failed sensor, window not yet full) holds neither."""

    metric: Metric
    sensor: Globs | None = None
    stat: Literal["mean", "min", "max", "last"] = "mean"
    window_s: WindowS = 0.0
    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _shape(self) -> MetricCondition:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of 'above' or 'below'")
        if self.stat != "last" and self.window_s <= 0:
            raise ValueError(f"stat '{self.stat}' needs window_s > 0 (or use stat: last)")
        if self.metric == "temperature_c" and self.sensor is None:
            raise ValueError("metric temperature_c needs 'sensor' (a channel id or label)")
        if self.metric != "temperature_c" and self.sensor is not None:
            raise ValueError(f"'sensor' is only for metric temperature_c, not {self.metric}")
        return self


class AllCondition(CondBase, kinds.AllCondition):
    all: list[Condition] = Field(min_length=1)


class AnyCondition(CondBase, kinds.AnyCondition):
    any: list[Condition] = Field(min_length=1)


class NotCondition(CondBase, kinds.NotCondition):
    not_: Condition = Field(alias="not")


class Schedule(Model, kinds.Schedule):
    """Local wall-clock time of day on given days; ``from`` > ``to`` wraps past midnight (22:00–07:00: the
    hours after midnight belong to the day before). Days: ``mon`` … ``sun``, ``workday`` (Monday to Friday,
    not a holiday), ``weekend``, ``holiday`` (a date of the policy's ``holidays``)."""

    days: list[Literal[(*DAYS, *DAY_WORDS)]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(DAYS))
    from_: HHMM = Field("00:00", alias="from")
    to: HHMM = "24:00"

    @model_validator(mode="after")
    def _not_empty(self) -> Schedule:
        if self.from_ == self.to or (self.from_, self.to) == ("24:00", "00:00"):
            raise ValueError(f"from {self.from_} to {self.to} is an empty window; for all day write from: "
                             "\"00:00\", to: \"24:00\"")
        return self


class ScheduleCondition(CondBase, kinds.ScheduleCondition):
    """Inside a time window: inline (``{from: "22:00", to: "07:00"}``), a list of them, or the name of one of
    the policy's ``schedules``; local time in the policy's ``timezone``, DST included."""

    schedule: Annotated[
        Annotated[Schedule, Tag("inline")] | Annotated[list[Schedule], Tag("list")]
        | Annotated[ScheduleName, Tag("name")],
        Discriminator(lambda v: "name" if isinstance(v, str) else "list" if isinstance(v, list) else "inline")]


class ProcessCondition(CondBase, kinds.ProcessCondition):
    """A running process whose name or command line matches one of the patterns (fnmatch)."""

    process: Globs


class StateCondition(CondBase, kinds.StateCondition):
    """A state machine is in a state: ``machine.state`` (a bare ``state`` when only one machine has it)."""

    state: str


CONDITION_TAGS = ("metric", "all", "any", "not", "schedule", "process", "state")


def _condition_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        return next((k for k in CONDITION_TAGS if k in value), None)
    return getattr(value, "TAG", None)


Condition = Annotated[
    Annotated[MetricCondition, Tag("metric")] | Annotated[AllCondition, Tag("all")]
    | Annotated[AnyCondition, Tag("any")] | Annotated[NotCondition, Tag("not")]
    | Annotated[ScheduleCondition, Tag("schedule")] | Annotated[ProcessCondition, Tag("process")]
    | Annotated[StateCondition, Tag("state")],
    Discriminator(_condition_tag, custom_error_type="condition_kind",
                  custom_error_message="a condition needs one of the keys: " + ", ".join(CONDITION_TAGS)),
]


# ----- fan curves ------------------------------------------------------------------------------------
class PointsCurve(Model, kinds.PointsCurve):
    """Duty (%) by linear interpolation between ``points`` [[°C, %], ...]; flat beyond the ends.
    ``hysteresis_c``: the duty falls only once the temperature dropped this far. ``smoothing_s``: the curve
    reads the time-weighted mean of its source over that many seconds (sensor noise averaged away)."""

    kind: Literal["points"]
    source: Source
    points: list[tuple[float, Pct]]
    hysteresis_c: NonNeg = 0.0
    smoothing_s: SmoothingS = 0.0

    @model_validator(mode="after")
    def _points(self) -> PointsCurve:
        if len(self.points) < 2:
            raise ValueError("a points curve needs at least 2 points [[°C, %], ...]")
        temps = [t for t, _ in self.points]
        if any(b <= a for a, b in zip(temps, temps[1:], strict=False)):
            raise ValueError("point temperatures must increase strictly")
        return self


class PidCurve(Model, kinds.PidCurve):
    """PID to ``setpoint_c``: duty = base_pct + kp·e + ki·∫e dt + kd·de/dt, e = temperature − setpoint
    (the temperature smoothed over ``smoothing_s`` when given)."""

    kind: Literal["pid"]
    source: Source
    smoothing_s: SmoothingS = 0.0
    setpoint_c: float
    kp: float = 2.0
    ki: float = 0.1
    kd: float = 0.0
    base_pct: Pct = 30.0


class MixCurve(Model, kinds.MixCurve):
    """The max/min/mean of other named curves."""

    kind: Literal["mix"]
    fn: Literal["max", "min", "mean"] = "max"
    curves: list[Name] = Field(min_length=1)


Curve = Annotated[PointsCurve | PidCurve | MixCurve, Field(discriminator="kind")]
CurveRef = Annotated[
    Annotated[Name, Tag("name")] | Annotated[Curve, Tag("inline")],
    Discriminator(lambda v: "name" if isinstance(v, str) else "inline" if isinstance(v, dict | BaseModel)
                  else None, custom_error_type="curve_ref",
                  custom_error_message="expected a curve name or an inline curve {kind: points|pid|mix}"),
]


# ----- state machines --------------------------------------------------------------------------------
class State(Model, kinds.State):
    name: Name
    enter: Condition | None = None
    exit: Condition | None = None
    min_dwell_s: NonNeg = 0.0


class Machine(Model, kinds.Machine):
    """Ordered states, lowest first. From state *i* (after its ``min_dwell_s``) the machine goes up to the
    highest later state whose ``enter`` holds, else back down one step when ``exit`` of *i* holds. It starts
    in the first state, whose actions apply only once its own ``enter`` has held (at once if it has none)."""

    per: Literal["gpu", "machine"] = "gpu"
    gpus: GpuSelector = "all"
    states: list[State] = Field(min_length=2)


# ----- rules -----------------------------------------------------------------------------------------
class RuleBase(Model):
    name: Name
    when: Condition | None = None


class GpuPowerLimitRule(RuleBase, kinds.GpuPowerLimitRule):
    """A GPU power limit: watts, % of the default, ``default``/``min``/``max``, or ``efficient`` — the
    limit the efficient-limit search finds for the job while ``when`` holds (snap to the job's own peak
    draw, then step down while it keeps ≥ 100 − ``max_slowdown_pct`` % of its throughput and work per
    joule improves; :mod:`aithermd.policy.efficient`). The search's tuning keys are only for
    ``efficient``."""

    kind: Literal["gpu_power_limit"]
    gpus: GpuSelector = "all"
    limit: PowerValue
    max_slowdown_pct: Annotated[float, Field(gt=0, le=20, description=(
        "efficient: the most throughput the job may lose against the default limit, %"))] | None = None
    step_pct: Annotated[float, Field(ge=1, le=20, description=(
        "efficient: each step down, % of the job's own draw"))] | None = None
    measure_s: Annotated[float, Field(ge=5, le=600, description=(
        "efficient: the measurement window of each step, s"))] | None = None
    floor_pct: Annotated[float, Field(ge=20, le=100, description=(
        "efficient: the lowest limit tried, % of the job's own draw"))] | None = None
    signal: Literal["auto", "progress", "gpm", "proxy"] | None = Field(None, description=(
        "efficient: the throughput signal (auto: the job's progress rate, else GPM tensor activity × SM "
        "clock, else utilization × SM clock)"))

    @model_validator(mode="after")
    def _search_keys(self) -> GpuPowerLimitRule:
        keys = [k for k in ("max_slowdown_pct", "step_pct", "measure_s", "floor_pct", "signal")
                if getattr(self, k) is not None]
        if keys and self.limit != "efficient":
            raise ValueError(f"{', '.join(keys)} only go with limit: efficient")
        return self


class CpuPowerLimitRule(RuleBase, kinds.CpuPowerLimitRule):
    """RAPL PL1 (long term) and/or PL2 (short term) in W, on zones by name pattern."""

    kind: Literal["cpu_power_limit"]
    zones: Globs = "package-*"
    pl1_w: Annotated[float, Field(gt=0)] | None = None
    pl2_w: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _some(self) -> CpuPowerLimitRule:
        if self.pl1_w is None and self.pl2_w is None:
            raise ValueError("give pl1_w, pl2_w or both")
        return self


class FanRule(RuleBase, kinds.FanRule):
    """Fans follow a curve (a name from ``curves`` or an inline curve) or a fixed ``duty_pct``.
    ``min_duty_pct`` and ``start_duty_pct`` default to what ``aithermd fans calibrate`` measured for each fan
    (its stop duty plus a margin, its start duty plus a margin); ``min_duty_pct: 0`` lets a calibrated fan
    stop, ``stop_hysteresis_pct`` below its stop duty."""

    kind: Literal["fan"]
    fans: Annotated[FanMatch, BeforeValidator(lambda v: {"id": v} if isinstance(v, str | list) else v,
                                              json_schema_input_type=str | list[str] | FanMatch)]
    curve: CurveRef | None = None
    duty_pct: Pct | None = None
    min_duty_pct: Pct | None = None
    start_duty_pct: Pct | None = None
    stop_hysteresis_pct: Pct = 2.0
    stop_below_c: float | None = None
    ramp_up_pct_s: Annotated[float, Field(gt=0)] | None = None
    ramp_down_pct_s: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _one(self) -> FanRule:
        if (self.curve is None) == (self.duty_pct is None):
            raise ValueError("give exactly one of 'curve' or 'duty_pct'")
        if self.stop_below_c is not None and self.curve is None:
            raise ValueError("stop_below_c reads the temperature of the rule's curve: it needs 'curve', "
                             "not 'duty_pct'")
        return self


from aithermd.policy.schema_clocks import GpuClocksRule  # noqa: E402 - needs RuleBase, GpuSelector above
Rule = Annotated[GpuPowerLimitRule | GpuClocksRule | CpuPowerLimitRule | CpuKnobsRule | FanRule,
                 Field(discriminator="kind")]


class Safety(Model, kinds.Safety):
    """Stricter safety only: a larger margin under each device's threshold, a lower GPU temperature cap."""

    margin_c: Annotated[float, Field(ge=BUILTIN_MARGIN_C, le=60)] = BUILTIN_MARGIN_C
    gpu_temp_limit_c: Annotated[float, Field(gt=0, le=120)] | None = None


class PolicyDocument(Model, kinds.PolicyDocument):
    """One policy file."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, title="aithermd policy",
                              defer_build=True, json_schema_extra={"$id": "https://github.com/aithermd/aithermd/policy.schema.json"})
    description: str = ""
    safety: Safety = Field(default_factory=Safety)
    curves: dict[Name, Curve] = Field(default_factory=dict)
    machines: dict[Name, Machine] = Field(default_factory=dict)
    rules: list[Rule] = Field(default_factory=list)
    budget: one_or_list(Budget, list[Budget]) | None = Field(None, description=(  # type: ignore[valid-type]
        "a node power budget split by demand (a list: the first whose `when` holds)"))
    quiet: one_or_list(Quiet, list[Quiet]) | None = Field(None, description=(  # type: ignore[valid-type]
        "noise ceilings met by lowering power first (a list: the first whose `when` holds)"))
    timezone: TimeZone = "local"
    holidays: Holidays = Field(default_factory=list)
    schedules: dict[ScheduleName, Annotated[list[Schedule], Field(min_length=1)]] = Field(
        default_factory=dict, description="named time windows: {schedule: NAME} in a condition")


FanSelector = Annotated[FanMatch, BeforeValidator(lambda v: {"id": v} if isinstance(v, str | list) else v,
                                                  json_schema_input_type=str | list[str] | FanMatch)]
schema_machine.rebuild({"Condition": Condition, "FanSelector": FanSelector, "GpuSelector": GpuSelector})
# every model is built at its first use (defer_build), its forward references resolved from its module then
_FORWARD = (AllCondition, AnyCondition, NotCondition, State, Machine, RuleBase, GpuPowerLimitRule,
            GpuClocksRule, CpuPowerLimitRule, FanRule, PolicyDocument)
_resolved: list[bool] = []


def resolve_fields() -> None:
    """Resolve the forward references in every model's ``model_fields`` (``Condition``, selectors), which
    :mod:`aithermd.policy.locate` walks to place an error. Validation needs none of it (it resolves them
    while building its one validator), so only that path pays: it builds every model's own validator."""
    if not _resolved:
        schema_machine.rebuild_models()
        for model in _FORWARD:
            model.model_rebuild()
        _resolved.append(True)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a policy file, for editors."""
    schema = PolicyDocument.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
