"""What a GPU draws and how much work it does, given its load, power limit and temperature. Pure.

Power: the card asks for ``demand = idle + util · (peak − idle)`` and the driver holds the draw at the
enforced power limit, so ``draw = min(limit, demand)`` (NVML ``nvmlDeviceGetEnforcedPowerLimit``: "the
power management algorithm caps the board power draw at this value"). ``peak`` is what sustained training
would draw with no limit: ``peak_demand_ratio`` × the default limit (1.2 by default — training kernels
hold a card at its default limit, and cards that allow a higher limit draw more when given it, which is
why raising the limit buys work at all).

Performance with diminishing returns in power: under a cap the driver lowers clocks and voltage until the
draw fits. Throughput relative to the uncapped run follows a power law in the dynamic (above-idle) power::

    throughput = util · ((draw − idle) / (demand − idle)) ** alpha      alpha = 0.4

so halving the dynamic power keeps 76 % of the work, and work per joule rises as the limit falls.
Source and calibration — published power-vs-throughput measurements of power-capped GPUs:

- Krzywaniak, Czarnul, Proficz, "Performance and Energy Aware Training of a Deep Neural Network in a
  Multi-GPU Environment with Power Capping", Euro-Par 2023: Parallel Processing Workshops (Springer
  LNCS, 2024), doi:10.1007/978-3-031-48803-0_1: caps of 160–200 W instead of the default 260 W cut
  training energy by up to 25 % for a modest loss of speed. The law above gives 20 % less energy per
  unit of work at 180 W.
- Frey et al., "Benchmarking Resource Usage for Efficient Distributed Deep Learning", MIT Lincoln Lab,
  arXiv:2201.12423 (2022): 3,400 training runs under power caps; training time fits a power law in the
  power cap with small exponents (well below 1: sub-linear slowdown).
- "AI Application Benchmarking: Power-Aware Performance Analysis for Vision and Language Models",
  arXiv:2603.16164: H100/H200 power-cap sweeps; the efficiency peak sits below the default limit and
  depends on the workload. A 14 % lower cap (700 → 600 W on an H100) costing 5–15 % of throughput is the
  commonly reported range; the law above gives 6 %.

The driver's own slowdown: at or above the GPU's slowdown temperature (``nvidia-smi -q`` "GPU Slowdown
Temp", NVML ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``) the hardware cuts clocks by half or more (clock event
reasons ``HW_SLOWDOWN`` and ``HW_THERMAL_SLOWDOWN``); here the dynamic power budget halves at the threshold
and shrinks linearly to nothing at the shutdown temperature (the driver keeps cutting clocks while the card
heats further), and stays halved until the temperature is ``slowdown_hysteresis_c`` below the threshold.
A power-bound card reports
``SW_POWER_CAP``; a card with no work reports ``GPU_IDLE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aithermd.sim.gpu_profile import GpuProfile

ALPHA = 0.4
IDLE_CLOCK_MHZ = 210.0

# clock event reason names as the NVML backend decodes them (nvmlClocksEventReason*)
GPU_IDLE = "gpu_idle"
SW_POWER_CAP = "sw_power_cap"
HW_SLOWDOWN = "hw_slowdown"
HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"


@dataclass(frozen=True, slots=True)
class GpuParams:
    """One card's electrical and thermal limits, in W, °C and MHz.

    ``idle_w`` < ``peak_w``; ``slowdown_temp_c`` is the driver's own slowdown threshold; ``max_clock_mhz``
    the SM clock at full speed.
    """

    idle_w: float
    peak_w: float
    slowdown_temp_c: float
    max_clock_mhz: float = 2520.0
    shutdown_temp_c: float | None = None  # None: slowdown + 5 °C
    alpha: float = ALPHA
    slowdown_factor: float = 0.5
    slowdown_hysteresis_c: float = 3.0

    def __post_init__(self) -> None:
        if not 0 <= self.idle_w < self.peak_w:
            raise ValueError(f"need 0 <= idle_w < peak_w, got {self.idle_w}, {self.peak_w}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    @classmethod
    def from_profile(cls, profile: GpuProfile, *, peak_demand_ratio: float = 1.2) -> GpuParams:
        """Parameters from a card's ``nvidia-smi -q`` profile.

        ``idle_w``: the dump's power draw when it looks idle (below 20 % of the default limit; dumps are
        mostly taken idle), else 6 % of the default limit. ``slowdown_temp_c``: the dump's slowdown
        temperature, else its target temperature + 3 °C (dumps that give the threshold only as T.Limit
        offsets), else 90 °C. Raises ``ValueError`` when the profile has no default or current limit.
        """
        default = profile.default_power_limit_w or profile.power_limit_w
        if not default:
            raise ValueError(f"{profile.source or profile.name}: no default power limit in the profile")
        draw = profile.power_draw_w
        idle = draw if draw is not None and 0 < draw < 0.2 * default else 0.06 * default
        if profile.slowdown_temp_c:
            slowdown = profile.slowdown_temp_c
        elif profile.target_temp_c:
            slowdown = profile.target_temp_c + 3.0
        else:
            slowdown = 90.0
        shutdown = profile.shutdown_temp_c
        if not shutdown or shutdown <= slowdown:
            shutdown = None
        return cls(idle_w=idle, peak_w=peak_demand_ratio * default, slowdown_temp_c=slowdown,
                   max_clock_mhz=profile.max_sm_clock_mhz or 2000.0, shutdown_temp_c=shutdown)


@dataclass(frozen=True, slots=True)
class GpuOutput:
    """One step's result: ``power_w`` drawn, ``throughput`` (work per second, 1.0 = full load uncapped),
    ``sm_clock_mhz``, ``slowdown`` (the driver's thermal slowdown is engaged) and ``reasons`` (clock event
    reason names)."""

    power_w: float
    throughput: float
    sm_clock_mhz: float
    slowdown: bool
    reasons: tuple[str, ...]


def demand_w(params: GpuParams, util_pct: float) -> float:
    """Power (W) the card would draw at ``util_pct`` with no limit: linear from idle to peak."""
    util = min(100.0, max(0.0, util_pct)) / 100.0
    return params.idle_w + util * (params.peak_w - params.idle_w)


def slowdown_engaged(params: GpuParams, temp_c: float, was_engaged: bool) -> bool:
    """Whether the driver's thermal slowdown is on: from the threshold up, until ``slowdown_hysteresis_c``
    below it."""
    if temp_c >= params.slowdown_temp_c:
        return True
    return was_engaged and temp_c > params.slowdown_temp_c - params.slowdown_hysteresis_c


def relative_throughput(params: GpuParams, util_pct: float, power_w: float) -> float:
    """Work per second at ``util_pct`` while drawing ``power_w`` (1.0 = 100 % util, uncapped)."""
    util = min(100.0, max(0.0, util_pct)) / 100.0
    if util <= 0:
        return 0.0
    need = demand_w(params, util_pct) - params.idle_w
    have = max(0.0, power_w - params.idle_w)
    if have >= need:
        return util
    return util * (have / need) ** params.alpha


def gpu_step(params: GpuParams, *, util_pct: float, limit_w: float, temp_c: float,
             was_slowdown: bool = False) -> GpuOutput:
    """Draw, throughput and clock of one card this step.

    ``limit_w`` is the enforced power limit; ``temp_c`` the die temperature at the start of the step;
    ``was_slowdown`` whether the thermal slowdown was on in the previous step (for its hysteresis).
    """
    slowdown = slowdown_engaged(params, temp_c, was_slowdown)
    want = demand_w(params, util_pct)
    budget = max(params.idle_w, limit_w)
    if slowdown:
        shutdown = params.shutdown_temp_c or params.slowdown_temp_c + 5.0
        span = shutdown - params.slowdown_temp_c
        factor = params.slowdown_factor * min(1.0, max(0.0, (shutdown - temp_c) / span))
        budget = params.idle_w + factor * (min(budget, want) - params.idle_w)
    power = min(want, budget)
    throughput = relative_throughput(params, util_pct, power)
    reasons: list[str] = []
    if util_pct <= 0:
        reasons.append(GPU_IDLE)
    if want > limit_w and not slowdown:
        reasons.append(SW_POWER_CAP)
    if slowdown:
        reasons += [HW_SLOWDOWN, HW_THERMAL_SLOWDOWN]
    util = min(100.0, max(0.0, util_pct)) / 100.0
    clock = (IDLE_CLOCK_MHZ if util <= 0
             else IDLE_CLOCK_MHZ + (params.max_clock_mhz - IDLE_CLOCK_MHZ) * throughput / util)
    return GpuOutput(power_w=power, throughput=throughput, sm_clock_mhz=round(clock),
                     slowdown=slowdown, reasons=tuple(reasons))


def firmware_fan_pct(temp_c: float, *, spinning: bool, target_temp_c: float = 84.0) -> float:
    """The duty (%) a card's own fan controller picks in automatic mode.

    Zero-RPM idle as consumer cards do it: the fans start at 50 °C and stop again below 45 °C
    (``spinning`` says whether they turned in the previous step); when turning, 30 % at 50 °C rising
    linearly to 100 % at ``target_temp_c`` − 4 °C. A model of the behaviour seen in dumps (0 % fan at idle
    on an RTX 4090) and reviews, not any vendor's table."""
    start_c, stop_c, top_c = 50.0, 45.0, target_temp_c - 4.0
    if temp_c < (stop_c if spinning else start_c):
        return 0.0
    if temp_c >= top_c:
        return 100.0
    return 30.0 + 70.0 * max(0.0, temp_c - start_c) / (top_c - start_c)
