"""The whole machine's keys of a policy file: a node power budget, a noise ceiling (quiet mode), named
schedules with holidays and a time zone. Parsed with :mod:`aithermd.policy.schema` (which hands these
models its ``Condition`` and selectors, :func:`rebuild`); run by :mod:`aithermd.policy.power_budget`,
:mod:`aithermd.policy.quiet` and :mod:`aithermd.policy.calendar`.

::

    timezone: Europe/Berlin          # schedules' local time (default: the machine's own zone)
    holidays: ["2026-12-24", "12-25", "01-01"]   # a date, or MM-DD every year
    schedules:
      quiet-hours:                   # a name conditions use: {schedule: quiet-hours}
        - {days: [workday], from: "22:00", to: "07:00"}
        - {days: [weekend, holiday], from: "20:00", to: "10:00"}
    budget:                          # or a list of budgets, the first whose `when` holds applies
      wall_w: 1500                   # at the wall (AC); or devices_w: the GPUs and CPU packages together
      psu_efficiency: 0.92           # or a curve [[load %, efficiency], ...] with psu_rated_w
      other_w: 75                    # the rest of the machine (board, memory, drives, fans), DC
    quiet:                           # or a list, the first whose `when` holds applies
      when: {schedule: quiet-hours}
      fans:
        - {fans: {chip: "nct*"}, max_duty_pct: 45}

Units: W, %, °C, s. The 80 PLUS efficiency levels are given at 10/20/50/100 % of the PSU's rated load
(the 80 PLUS test protocol, CLEAResult/Ecova); a curve in those terms is what a PSU's datasheet shows.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from aithermd.policy import kinds
from aithermd.policy.kinds import parse_holiday
from aithermd.policy.values import Model, Name, NonNeg, Pct, one_or_list

__all__ = ["DAY_WORDS", "EPP_NAMES", "PLATFORM_PROFILES", "Budget", "CpuKnobsRule", "FanCeiling", "Holidays", "Quiet", "ScheduleName", "TimeZone", "check_timezone",
           "parse_holiday", "rebuild"]

# the kernel's names: EPP strings (intel_pstate.rst, amd-pstate.rst) and ACPI platform profiles
# (ABI/testing/sysfs-platform_profile)
EPP_NAMES = ("performance", "balance_performance", "balance_power", "power")
PLATFORM_PROFILES = ("low-power", "cool", "quiet", "balanced", "balanced-performance", "performance", "max-power",
                     "custom")
# day words beside mon..sun: a workday is Monday to Friday and not a holiday; a holiday is a listed date
DAY_WORDS = ("workday", "weekend", "holiday")
EfficiencyPoint = tuple[Annotated[float, Field(gt=0, le=100)], Annotated[float, Field(ge=0.5, le=1.0)]]


def check_timezone(name: str) -> str:
    """``name`` when it is ``local`` or an IANA zone this machine knows (``Europe/Berlin``). Raises
    ValueError naming what to do."""
    if name == "local":
        return name
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone '{name}': give an IANA name (Europe/Berlin, America/New_York) "
                         "or 'local' (install tzdata if the name is right)") from exc
    return name


class Budget(Model, kinds.Budget):
    """A node power budget, split every tick by demand (:mod:`aithermd.policy.power_budget`): idle GPUs go
    to their minimum limit, busy GPUs and the CPU packages share the rest by their measured draw and
    utilization, never below a device's minimum and never above what its own rule asks; the limits in
    force never add up to more than the budget. ``wall_w`` is at the wall (AC): the devices get
    ``wall_w`` × efficiency − ``other_w``; ``devices_w`` is for the GPUs and CPU packages together."""

    when: Condition | None = None  # type: ignore[name-defined]  # noqa: F821 - rebuilt by schema.py
    wall_w: Annotated[float, Field(gt=0, le=100_000, description=(
        "the most the machine may draw at the wall (the circuit, a UPS, the PSU's input), W AC"))] | None = None
    psu_efficiency: one_or_list(  # type: ignore[valid-type]
        Annotated[float, Field(ge=0.5, le=1.0)], list[EfficiencyPoint]) = Field(0.9, description=(
        "the PSU's efficiency (DC out / AC in): one number, or [[load % of psu_rated_w, efficiency], ...] "
        "as its datasheet or 80 PLUS level gives it (the lowest efficiency at or above the load is used)"))
    psu_rated_w: Annotated[float, Field(gt=0, le=100_000, description=(
        "the PSU's DC rating, W: the devices never get more than it less other_w"))] | None = None
    other_w: Annotated[NonNeg, Field(le=10_000, description=(
        "the rest of the machine (board, memory, drives, fans, the display GPU), W DC: nothing measures it"))] \
        = 75.0
    devices_w: Annotated[float, Field(gt=0, le=100_000, description=(
        "instead of wall_w: the budget of the GPUs and CPU packages together, W"))] | None = None
    gpus: GpuSelector = Field("all", description=(  # type: ignore[name-defined]  # noqa: F821
        "the GPUs that share the budget; the others are counted at their limit in force"))
    cpu: bool = Field(True, description="the CPU packages share the budget (RAPL PL1/PL2); false: only GPUs, "
                                        "the CPU counted at its present PL2 (else PL1)")
    cpu_min_w: Annotated[float, Field(gt=0, le=1000)] = Field(45.0, description=(
        "the lowest limit the budget gives a CPU package (or RAPL's own minimum, if higher), W: it feeds "
        "the GPUs"))
    idle_below_pct: Pct = Field(10.0, description="a GPU or CPU whose mean utilization over window_s is "
                                                  "below this is idle: it gets its minimum, %")
    window_s: Annotated[float, Field(ge=1, le=600)] = Field(10.0, description=(
        "draw and utilization are averaged over this long, s"))
    step_w: Annotated[float, Field(ge=1, le=100)] = Field(5.0, description=(
        "limits move in steps of this many W; a smaller change up is not written"))

    @model_validator(mode="after")
    def _shape(self) -> Budget:
        if (self.wall_w is None) == (self.devices_w is None):
            raise ValueError("give exactly one of wall_w (at the wall) or devices_w (GPUs and CPU together)")
        curve = isinstance(self.psu_efficiency, list)
        if self.devices_w is not None and "psu_efficiency" in self.model_fields_set:
            raise ValueError("psu_efficiency goes with wall_w: devices_w is already on the DC side")
        if curve:
            points = self.psu_efficiency
            if len(points) < 2:  # type: ignore[arg-type]
                raise ValueError("an efficiency curve needs at least 2 points [[load %, efficiency], ...]")
            loads = [p[0] for p in points]  # type: ignore[union-attr]
            if any(b <= a for a, b in zip(loads, loads[1:], strict=False)):
                raise ValueError("the curve's load percentages must increase strictly")
            if self.psu_rated_w is None:
                raise ValueError("an efficiency curve is in % of the PSU's rated load: give psu_rated_w")
        if self.wall_w is not None:  # worked out as the engine splits it: nothing left is a policy error
            from aithermd.policy.power_budget import devices_budget_w

            total, how = devices_budget_w(self)
            if total <= 0:
                raise ValueError(f"{how}: nothing is left for the GPUs and CPU packages; raise wall_w or "
                                 "lower other_w")
        return self


class FanCeiling(Model, kinds.FanCeiling):
    """A noise ceiling for a group of fans: at most ``max_duty_pct`` or ``max_rpm`` (exactly one)."""

    fans: FanSelector  # type: ignore[name-defined]  # noqa: F821 - rebuilt by schema.py
    max_duty_pct: Pct | None = None
    max_rpm: Annotated[float, Field(gt=0, le=50_000)] | None = None

    @model_validator(mode="after")
    def _one(self) -> FanCeiling:
        if (self.max_duty_pct is None) == (self.max_rpm is None):
            raise ValueError("give exactly one of max_duty_pct or max_rpm")
        return self


class Quiet(Model, kinds.Quiet):
    """A noise ceiling (:mod:`aithermd.policy.quiet`): the fans of each group stay at or below their ceiling.
    It is met first by lowering the power limits (GPU, RAPL) of what heats each fan's sensors as they come
    within ``approach_c`` of the temperature at which the fan's curve would pass the ceiling; only when
    those limits are at their lowest and the temperature still passes that point, or within
    ``danger_margin_c`` of the safety threshold, does the fan follow its curve above the ceiling. The built-in
    safety layer still overrides everything."""

    when: Condition | None = None  # type: ignore[name-defined]  # noqa: F821 - rebuilt by schema.py
    fans: list[FanCeiling] = Field(min_length=1)
    approach_c: Annotated[float, Field(ge=1, le=30)] = Field(8.0, description=(
        "limits start coming down this many °C below the temperature where a curve passes its ceiling"))
    min_limit_pct: Annotated[float, Field(ge=10, le=100)] = Field(50.0, description=(
        "the lowest limit quiet sets, % of what the rule asks (never below the device's minimum)"))
    danger_margin_c: Annotated[float, Field(ge=0, le=40)] = Field(10.0, description=(
        "within this many °C of the safety threshold a fan may pass its ceiling at once, until every source "
        "has read 5 °C under that line for 300 s"))
    ramp_pct_s: Annotated[float, Field(gt=0, le=100)] = Field(2.0, description=(
        "how fast a limit moves under quiet, % of the rule's limit per s (down and up)"))
    gpu_target_temp_c: Annotated[float, Field(ge=40, le=100)] | None = Field(None, description=(
        "NVIDIA GPUs whose driver exposes the acoustic threshold (GPU Target Temperature) get it, °C, "
        "within the driver's range"))


class CpuKnobsRule(Model, kinds.CpuKnobsRule):
    """The CPU's own knobs while ``when`` holds: EPP, the cpufreq governor, boost and the ACPI platform
    profile (:mod:`aithermd.backends.cpu_knobs`). A knob the machine lacks, or a name it does not offer,
    is left alone; none is touched while power-profiles-daemon or tuned runs."""

    kind: Literal["cpu_knobs"]
    name: Name
    when: Condition | None = None  # type: ignore[name-defined]  # noqa: F821 - rebuilt by schema.py
    epp: Literal[EPP_NAMES] | None = Field(None, description=(  # type: ignore[valid-type]
        "energy_performance_preference of every cpufreq policy"))
    governor: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=32, description=(
        "scaling_governor of every cpufreq policy (performance, powersave, schedutil, ...)"))] | None = None
    boost: bool | None = Field(None, description="CPU boost (turbo): cpufreq boost or intel_pstate no_turbo")
    platform_profile: Literal[PLATFORM_PROFILES] | None = Field(None, description=(  # type: ignore[valid-type]
        "/sys/firmware/acpi/platform_profile"))

    @model_validator(mode="after")
    def _some(self) -> CpuKnobsRule:
        if all(getattr(self, k) is None for k in ("epp", "governor", "boost", "platform_profile")):
            raise ValueError("give at least one of epp, governor, boost or platform_profile")
        return self


def _holidays(value: Any) -> Any:
    if isinstance(value, list):
        value = [str(v) for v in value]  # YAML may read 2026-12-24 as a date
        for item in value:
            parse_holiday(item)
    return value


TimeZone = Annotated[str, AfterValidator(check_timezone),
                     Field(description="local time of schedules: an IANA zone (Europe/Berlin) or 'local'")]
Holidays = Annotated[list[Annotated[str, Field(min_length=4)]], BeforeValidator(_holidays), Field(
    description="dates that count as 'holiday' in schedules: YYYY-MM-DD, or MM-DD every year")]
ScheduleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=64)]


def rebuild(namespace: dict[str, Any]) -> None:
    """Resolve ``Condition``, ``FanSelector`` and ``GpuSelector`` (defined in :mod:`aithermd.policy.schema`):
    put in this module's namespace, where the models (built at their first use, ``defer_build``) find them."""
    globals().update(namespace)


def rebuild_models() -> None:
    """Resolve the fields of this module's models that name ``Condition`` or a selector (after :func:`rebuild`);
    see :func:`aithermd.policy.schema.resolve_fields`."""
    for model in (Budget, FanCeiling, Quiet, CpuKnobsRule):
        model.model_rebuild()
