"""What a GPU draws, shows and truly does in one step, given its job, power limit, clock lock and
temperature. Pure.

Two truths (:mod:`aithermd.sim.jobs`): :class:`GpuOutput` carries what NVML would show — power,
utilization, memory utilization, SM clock, clock-event reasons, P-state, and on Hopper-class cards the GPM
tensor and SM activity — and, apart, the hidden ``work`` the job really did (seconds of unbound full-speed
work per second). The daemon only ever sees the first.

Power: the job's demand this second is the trace's own ``power.draw`` when the workload has one, else the
job's own draw (a share of the card's default limit) scaled by utilization and its second-by-second swing.
Under a limit the law of :mod:`aithermd.sim.law` (fitted on the Zeus sweeps) gives the drawn power and
throughput against that demand; under an SM clock lock the job's own clock law
(:func:`aithermd.sim.jobs.operate`). Nothing is gained above the job's own demand: a higher limit changes
nothing once it no longer binds. Idle draws the card's floor (the dump's idle draw), or more when the
card is held high.

What NVML shows, and why it misleads the cheap proxies the realistic way:

- utilization (% of time a kernel ran) does not fall under a cap: kernels run longer but back to back;
- the SM clock falls with the cap by more than the work does when the job is memory-bound (Amdahl over the
  clock with the hidden μ), so "utilization × SM clock" overstates the slowdown;
- memory utilization is the memory-bound share of the step time (``util · μ · r``): high for decode;
- GPM (``nvmlGpmMetricsGet``, Hopper and newer only): tensor-pipe activity, the share of time the SMs ran
  tensor work, ``util · (1 − μ) · r / φ``; times the clock it tracks the true work (the pipe's cycles are
  the work's cycles), hence the second-best signal after a job's own progress counter.

The driver's own slowdown: at or above the GPU's slowdown temperature (``nvidia-smi -q`` "GPU Slowdown
Temp", NVML ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``) the hardware cuts clocks by half or more (clock event
reasons ``HW_SLOWDOWN`` and ``HW_THERMAL_SLOWDOWN``); here the power budget above idle halves at the
threshold and shrinks linearly to nothing at the shutdown temperature, and stays halved until the
temperature is ``slowdown_hysteresis_c`` below the threshold. A power-bound card reports
``SW_POWER_CAP``; a card with no work reports ``GPU_IDLE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aithermd.sim import jobs as jobmod
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.jobs import IDLE, Job

IDLE_CLOCK_MHZ = 210.0  # RTX 4090 dump, P8 idle SM clock
HELD_CLOCK_RATIO = 0.6  # SM clock of a held-high idle card, over its top clock (model choice)
HOPPER_ARCHITECTURES = ("hopper", "blackwell")  # GPM needs Hopper or newer (NVML nvmlGpmQueryDeviceSupport)

# clock event reason names as the NVML backend decodes them (nvmlClocksEventReason*)
GPU_IDLE = "gpu_idle"
SW_POWER_CAP = "sw_power_cap"
HW_SLOWDOWN = "hw_slowdown"
HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"


@dataclass(frozen=True, slots=True)
class GpuParams:
    """One card's electrical and thermal facts, in W, °C and MHz.

    ``idle_w`` is the idle floor, ``default_w`` the default power limit (jobs' own draws are shares of
    it); ``slowdown_temp_c`` the driver's own slowdown threshold; ``max_clock_mhz`` the SM clock of a job
    no limit holds; ``gpm`` whether NVML offers GPM metrics (Hopper and newer); ``datacenter`` whether the
    card idles at P0 (datacenter boards do) rather than P8.
    """

    idle_w: float
    default_w: float
    slowdown_temp_c: float
    max_clock_mhz: float = 2520.0
    shutdown_temp_c: float | None = None  # None: slowdown + 5 °C
    slowdown_factor: float = 0.5
    slowdown_hysteresis_c: float = 3.0
    gpm: bool = False
    datacenter: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.idle_w < self.default_w:
            raise ValueError(f"need 0 <= idle_w < default_w, got {self.idle_w}, {self.default_w}")

    @classmethod
    def from_profile(cls, profile: GpuProfile) -> GpuParams:
        """Parameters from a card's ``nvidia-smi -q`` profile.

        ``idle_w``: the dump's power draw when it looks idle (below 20 % of the default limit; dumps are
        mostly taken idle), else a share of the default limit: 6 % for a card with fans (the RTX 4090 idles
        at 4–6 % in its dumps and traces), 10 % for a passive datacenter board (idles at P0: H100 70 W of
        700, A100 60 W of 500, the L40S dump's idle dmon 37 W of 350).
        ``slowdown_temp_c``: the dump's slowdown
        temperature, else its target temperature + 3 °C (dumps that give the threshold only as T.Limit
        offsets), else 90 °C. ``gpm`` from the architecture. Raises ``ValueError`` when the profile has no
        default or current limit.
        """
        default = profile.default_power_limit_w or profile.power_limit_w
        if not default:
            raise ValueError(f"{profile.source or profile.name}: no default power limit in the profile")
        draw = profile.power_draw_w
        share = 0.06 if profile.fan_speeds_pct else 0.10
        idle = draw if draw is not None and 0 < draw < 0.2 * default else share * default
        if profile.slowdown_temp_c:
            slowdown = profile.slowdown_temp_c
        elif profile.target_temp_c:
            slowdown = profile.target_temp_c + 3.0
        else:
            slowdown = 90.0
        shutdown = profile.shutdown_temp_c
        if not shutdown or shutdown <= slowdown:
            shutdown = None
        arch = (profile.architecture or "").lower()
        return cls(idle_w=idle, default_w=default, slowdown_temp_c=slowdown,
                   max_clock_mhz=profile.max_sm_clock_mhz or 2000.0, shutdown_temp_c=shutdown,
                   gpm=arch.startswith(HOPPER_ARCHITECTURES), datacenter=not profile.fan_speeds_pct)


@dataclass(frozen=True, slots=True)
class GpuOutput:
    """One step's result. Visible: ``power_w``, ``util_pct``, ``memory_util_pct``, ``sm_clock_mhz``,
    ``reasons`` (clock event reason names), ``pstate``, ``gpm_tensor_pct`` (None without GPM),
    ``slowdown`` (the driver's thermal slowdown is engaged). Hidden: ``work`` (work per second, 1.0 =
    full load, unbound)."""

    power_w: float
    work: float
    util_pct: float
    memory_util_pct: float
    sm_clock_mhz: float
    slowdown: bool
    reasons: tuple[str, ...]
    pstate: str
    gpm_tensor_pct: float | None = None

    @property
    def throughput(self) -> float:
        return self.work


def slowdown_engaged(params: GpuParams, temp_c: float, was_engaged: bool) -> bool:
    """Whether the driver's thermal slowdown is on: from the threshold up, until ``slowdown_hysteresis_c``
    below it."""
    if temp_c >= params.slowdown_temp_c:
        return True
    return was_engaged and temp_c > params.slowdown_temp_c - params.slowdown_hysteresis_c


def demand_w(params: GpuParams, job: Job | None, util_pct: float, *, draw_w: float | None = None,
             scale: float = 1.0) -> float:
    """What the card would draw this second with nothing binding (W): ``draw_w`` when known, else the
    job's own draw × ``scale`` at 100 % utilization, linear from the idle floor below it."""
    if draw_w is not None:
        return max(draw_w, 0.0)
    if job is None or job.kind == IDLE:
        return params.idle_w
    util = min(100.0, max(0.0, util_pct)) / 100.0
    own = max(params.idle_w, job.draw_ratio * params.default_w * scale)
    return params.idle_w + util * (own - params.idle_w)


def gpu_step(params: GpuParams, job: Job | None, *, util_pct: float, limit_w: float, temp_c: float,
             was_slowdown: bool = False, draw_w: float | None = None, scale: float = 1.0,
             lock_mhz: float | None = None, jitter: float = 1.0) -> GpuOutput:
    """Draw, work and what NVML shows of one card this step.

    ``job`` (None: idle at the floor); ``util_pct`` the workload's utilization; ``limit_w`` the enforced
    power limit; ``temp_c`` the die temperature at the start of the step; ``was_slowdown`` whether the
    thermal slowdown was on in the previous step; ``draw_w``/``scale`` the demand (:func:`demand_w`);
    ``lock_mhz`` the upper SM clock of a locked clock range (None: not locked); ``jitter`` the second's own
    swing on top of the drawn power (never above the limit).
    """
    slowdown = slowdown_engaged(params, temp_c, was_slowdown)
    util = min(100.0, max(0.0, util_pct))
    lock = None if lock_mhz is None else min(1.0, lock_mhz / params.max_clock_mhz)
    busy = job is not None and job.kind != IDLE and util > 0
    if not busy:
        floor = params.idle_w
        if job is not None and job.kind == IDLE and draw_w is None:
            power = jobmod.held_idle_w(job, floor, lock)
        else:
            power = draw_w * jitter if draw_w is not None else floor
            if draw_w is not None and lock is not None and lock <= 0.2 and power > floor:
                share = job.held_sm_share if job is not None else sum(jobmod.HELD_SM_SHARE) / 2.0
                power = floor + (power - floor) * (1.0 - share)
        held = (job is not None and job.kind == IDLE and job.held_ratio > 1.0) if draw_w is None \
            else power > 1.25 * floor  # a held card stays in its high P-state, whatever a lock saves
        clock = IDLE_CLOCK_MHZ if not held else params.max_clock_mhz * HELD_CLOCK_RATIO
        if lock is not None:
            clock = min(clock, params.max_clock_mhz * lock)
        pstate = "P0" if held or params.datacenter else "P8"
        return GpuOutput(power_w=power, work=0.0, util_pct=util, memory_util_pct=0.0,
                         sm_clock_mhz=round(clock), slowdown=slowdown, reasons=(GPU_IDLE,), pstate=pstate,
                         gpm_tensor_pct=0.0 if params.gpm else None)
    assert job is not None
    want = demand_w(params, job, util, draw_w=draw_w, scale=scale)
    budget = max(params.idle_w, limit_w)
    if slowdown:
        shutdown = params.shutdown_temp_c or params.slowdown_temp_c + 5.0
        span = shutdown - params.slowdown_temp_c
        factor = params.slowdown_factor * min(1.0, max(0.0, (shutdown - temp_c) / span))
        budget = params.idle_w + factor * (min(budget, want) - params.idle_w)
    op = jobmod.operate(job, budget / max(want, 1e-6), lock)
    power = max(params.idle_w, min(want * op.u * jitter, max(budget, want * op.u)))
    if slowdown:  # the hardware cuts the clocks itself: the draw follows its budget
        power = max(params.idle_w, min(power, budget))
    share = util / 100.0
    reasons: list[str] = []
    if op.capped and not slowdown:
        reasons.append(SW_POWER_CAP)
    if slowdown:
        reasons += [HW_SLOWDOWN, HW_THERMAL_SLOWDOWN]
    tensor = 100.0 * share * (1.0 - job.mem_frac) * op.r / op.clock if params.gpm else None
    return GpuOutput(power_w=power, work=share * op.r, util_pct=util,
                     memory_util_pct=100.0 * share * job.mem_frac * op.r,
                     sm_clock_mhz=round(params.max_clock_mhz * op.clock), slowdown=slowdown,
                     reasons=tuple(reasons), pstate="P0", gpm_tensor_pct=tensor)


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
