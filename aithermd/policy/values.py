"""Value types of the policy language: names, patterns, percentages, times of day, power values and a fan
curve's temperature source (plain patterns, optional inputs, alternatives in order).

Power values (GPU limits) are watts (``300``, ``"300 W"``), a percentage of the card's default (``"80%"``),
or ``default``, ``min``, ``max`` (the card's own constraints, from NVML
``nvmlDeviceGetPowerManagementLimitConstraints`` and ``nvmlDeviceGetPowerManagementDefaultLimit``), or
``efficient`` (the limit the efficient-limit search finds for the running job:
:mod:`aithermd.policy.efficient`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    model_validator,
)

from aithermd.policy import kinds
from aithermd.policy.kinds import BUILTIN_MARGIN_C, DAYS, parse_clock, parse_power

__all__ = ["BUILTIN_MARGIN_C", "DAYS", "parse_clock", "parse_power"]  # the value forms live in kinds.py


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=64)]
NonNeg = Annotated[float, Field(ge=0)]
MAX_WINDOW_S = 86400.0  # a window keeps its samples: a day at most, so a typo cannot grow memory for years
WindowS = Annotated[float, Field(ge=0, le=MAX_WINDOW_S)]
MAX_SMOOTHING_S = 600.0  # a fan curve's input smoothing: ten minutes at most (longer would hide real heat)
SmoothingS = Annotated[float, Field(ge=0, le=MAX_SMOOTHING_S, description=(
    "the curve reads the time-weighted mean of its source over the last this many seconds (0: each reading "
    "as it comes); a failed source still sends the fans to full at once"))]
Pct = Annotated[float, Field(ge=0, le=100)]
Glob = Annotated[str, Field(min_length=1)]


def _listify(value: Any) -> Any:
    return [value] if isinstance(value, str | int) and not isinstance(value, bool) else value


# one pattern or a list of them; always a list once parsed
Globs = Annotated[list[Glob], BeforeValidator(_listify, json_schema_input_type=str | list[str])]
Ints = Annotated[list[int], BeforeValidator(_listify, json_schema_input_type=int | list[int])]
HHMM = Annotated[str, Field(pattern=r"^(([01]?\d|2[0-3]):[0-5]\d|24:00)$")]

def _check_clock(value: Any) -> float | str:
    if not isinstance(value, int | float | str):
        raise ValueError("expected MHz (1500 or '1500 MHz'), a percentage of the top clock ('60%'), 'min', "
                         "'max' or 'efficient'")
    parse_clock(value)
    return value


ClockValue = Annotated[float | str, PlainValidator(_check_clock, json_schema_input_type=float | str),
                       Field(json_schema_extra={"examples": [1500, "1500 MHz", "60%", "min", "max",
                                                             "efficient"]})]


def _check_power(value: Any) -> float | str:
    if not isinstance(value, int | float | str):
        raise ValueError("expected watts (300 or '300 W'), a percentage of the default ('80%'), "
                         "'default', 'min', 'max' or 'efficient'")
    parse_power(value)
    return value


PowerValue = Annotated[float | str, PlainValidator(_check_power, json_schema_input_type=float | str),
                       Field(json_schema_extra={"examples": [300, "300 W", "80%", "default", "min", "max",
                                                             "efficient"]})]


def one_or_list(one: Any, many: Any) -> Any:
    """``one`` or ``many`` (a list type), validated as the one its YAML shape says (a sequence or not): an
    error then names the field at its line, not both branches of a union."""
    return Annotated[Annotated[one, Tag("one")] | Annotated[many, Tag("list")],
                     Discriminator(lambda v: "list" if isinstance(v, list) else "one")]


class Model(BaseModel):
    # allow_inf_nan=False: .nan and .inf are refused where a number is expected (a NaN threshold never holds,
    # a NaN curve point or setpoint would drive a NaN duty)
    # defer_build: a model's validator is built at its first use, not at import; validating a document then
    # builds one schema for the whole tree instead of one per model class (20 ms of the parser child's
    # 0.19 s of CPU at a first start, issue 22)
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False, validate_default=True,
                              allow_inf_nan=False, defer_build=True)


# ----- curve sources ---------------------------------------------------------------------------------
class SourceInput(Model, kinds.SourceInput):
    """One input of a curve's source, in place of a plain pattern:

    - ``sensor``: channels by id or label pattern, like a plain pattern; with ``optional: true`` a channel
      that fails is left out of the aggregate instead of sending the fans to full;
    - ``first``: alternatives in order (each a pattern or a list of them): the channels of the first one
      this machine has are the input (Tctl/Tdie, then ``Package id *``, then a board thermistor, then
      ``acpitz``); the others never stand in for a chosen channel that fails;
    - ``same_gpu``: channel names (``temperature``, ``memory_temperature``) of *the GPU whose fan the rule
      drives*: one rule gives each GPU's fans that GPU's own temperature (on a fan that is not a GPU's,
      it matches nothing).

    A plain pattern is a required input: every channel it matches must read, or the fans go to full."""

    sensor: Globs | None = None
    first: list[Globs] | None = Field(None, min_length=1)
    same_gpu: Globs | None = None
    optional: bool = False

    @model_validator(mode="after")
    def _one(self) -> SourceInput:
        if sum(v is not None for v in (self.sensor, self.first, self.same_gpu)) != 1:
            raise ValueError("give exactly one of 'sensor' (patterns), 'first' (alternatives in order) or "
                             "'same_gpu' (channels of the fan's own GPU)")
        return self


SourceItem = Annotated[
    Annotated[Glob, Tag("pattern")] | Annotated[SourceInput, Tag("input")],
    Discriminator(lambda v: "pattern" if isinstance(v, str) else "input" if isinstance(v, dict | BaseModel)
                  else None, custom_error_type="source_input",
                  custom_error_message="expected a sensor pattern or {sensor: ..., optional: ...}, "
                                       "{first: [...], optional: ...} or {same_gpu: temperature}"),
]


class SourceAgg(Model, kinds.SourceAgg):
    """Several temperature sources combined: exactly one of ``max``, ``min``, ``mean``, each a list of
    sensor patterns and :class:`SourceInput` entries (optional inputs, alternatives in order)."""

    max: list[SourceItem] | None = None
    min: list[SourceItem] | None = None
    mean: list[SourceItem] | None = None

    @model_validator(mode="after")
    def _one(self) -> SourceAgg:
        given = [k for k in ("max", "min", "mean") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'max', 'min' or 'mean' with a list of sensors")
        if not getattr(self, given[0]):
            raise ValueError(f"'{given[0]}' needs at least one sensor")
        return self


Source = Annotated[SourceAgg, BeforeValidator(
    lambda v: {"max": [v]} if isinstance(v, str) else v, json_schema_input_type=str | SourceAgg)]
