"""One simulated GPU card over time: its cooler, its running totals, and its stock twin.

Cooling is two thermal nodes. The die sits ``die_k_per_w`` × power above its heatsink at once (within the
1 s of a trace sample), and the heatsink is a lumped mass cooled by the card's fans (or, for a passively
cooled board, the chassis fans) into the intake air (:mod:`aithermd.sim.thermal`). NVML reads the die.
Constants, scaled by the card's default power limit (a cooler is sized for its card):

- fan-cooled cards, from the recorded RTX 4090 runs: the Windows training trace idles at 17.6 W and
  33 °C with its fans stopped (zero-RPM), then jumps 35 → 49 °C within 3 s when ~300 W start and settles
  at 49–53 °C under the card's own fan control, and drops 55 → 38 °C within 6 s when the load stops (the
  die over its heatsink: ~0.05 K/W at 450 W default; the heatsink itself moves only a few kelvin, with a
  time constant of ~15 s). The passive conductance gives the idle point, the fan conductance the load
  point at the ~32 % duty the firmware curve gives at 51 °C, with intake air at ~30 °C;
- passively cooled datacenter boards, from the H100 80GB HBM3 dump: 59 °C at 629 W under gpu-burn
  (``nvidia-smi -q``; 63–65 °C in the dmon seconds after it), at ~45 % chassis fan duty with ~30 °C
  intake; idle then sits near 31 °C at 69 W, between that dump's own 41 °C (a server whose fans slow at
  idle) and the H200 dump's 28 °C at 77 W. Their heat leaves through the chassis (ducted boards), so only
  :data:`HEAT_INTO_CASE_PASSIVE` of it warms the case air, against
  :data:`HEAT_INTO_CASE_OPEN_AIR` for open-air coolers that blow into the case.

The **stock twin** of each card runs the same job on the same demand, second by second, at the card's
default limit with no clock lock and its fans under their own control, with its own temperature: what the
same seed would have done with no daemon. The summary compares the two (work per joule, slowdown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aithermd.sim import gpu_model, thermal
from aithermd.sim.gpu_model import GpuOutput, GpuParams
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.workload import GpuLoad

REF_DEFAULT_W = 450.0  # RTX 4090 default limit: the fan-cooled reference card
FAN_DIE_K_PER_W = 0.05  # die over heatsink at the reference (Windows 4090 trace: +14 K in 3 s at +280 W)
FAN_G_PASSIVE = 3.0  # W/K: 17.6 W idle 6 K over ~27 °C intake with the fans stopped
FAN_G_FAN = 104.0  # W/K at 100 % duty: 300 W at 51 °C with ~32 % duty and ~30 °C intake
FAN_HEAT_CAPACITY = 600.0  # J/K: heatsink time constant ~15 s at load duty (Windows trace cool-down)
REF_PASSIVE_W = 700.0  # H100 SXM default limit: the passively cooled reference board
PASSIVE_DIE_K_PER_W = 0.025  # 16 K at 630 W
PASSIVE_G_PASSIVE = 8.0  # W/K with the chassis fans stopped
PASSIVE_G_FAN = 85.0  # W/K at 100 % chassis duty: 629 W at 59 °C, ~45 % duty, ~30 °C intake
PASSIVE_HEAT_CAPACITY = 1500.0  # J/K: a large vapour-chamber heatsink, τ ~ 30 s
HEAT_INTO_CASE_OPEN_AIR = 0.6  # open-air coolers exhaust most of their heat into the case
HEAT_INTO_CASE_PASSIVE = 0.1  # ducted passive boards exhaust through the chassis


@dataclass(frozen=True, slots=True)
class GpuCooling:
    """A card's heatsink (``sink``) and its die's rise over it (``die_k_per_w``)."""

    sink: thermal.ThermalParams
    die_k_per_w: float
    heat_into_case: float


def gpu_cooling(profile: GpuProfile) -> GpuCooling:
    """The cooler of a card from its dump: fan-cooled when the dump shows fans, else passive; sized by its
    default power limit against the reference card (see the module docstring)."""
    default = profile.default_power_limit_w or profile.power_limit_w or 300.0
    if profile.fan_speeds_pct:
        k = default / REF_DEFAULT_W
        return GpuCooling(thermal.ThermalParams(FAN_HEAT_CAPACITY * k, FAN_G_PASSIVE * k, FAN_G_FAN * k),
                          FAN_DIE_K_PER_W / k, HEAT_INTO_CASE_OPEN_AIR)
    k = default / REF_PASSIVE_W
    sink = thermal.ThermalParams(PASSIVE_HEAT_CAPACITY * k, PASSIVE_G_PASSIVE * k, PASSIVE_G_FAN * k)
    return GpuCooling(sink, PASSIVE_DIE_K_PER_W / k, HEAT_INTO_CASE_PASSIVE)


@dataclass
class CardState:
    """Temperatures and totals of one card (the real one or its stock twin)."""

    sink_c: float
    temp_c: float
    slowdown: bool = False
    spinning: bool = False
    energy_j: float = 0.0
    work: float = 0.0
    peak_temp_c: float = 0.0
    slowdown_s: float = 0.0
    fan_duty_pct: float = 0.0


def step_card(params: GpuParams, cooling: GpuCooling, state: CardState, load: GpuLoad, *, limit_w: float,
              lock_mhz: float | None, fan_duties: list[float] | None, case_duty_pct: float, air_c: float,
              dt_s: float, target_temp_c: float) -> tuple[GpuOutput, float]:
    """Advance one card by ``dt_s``: its output this step and the firmware fan curve's duty (%).
    ``fan_duties``: each fan's duty when the daemon holds it (None per fan = automatic) — None for a card
    without fans, whose airflow is the chassis fans' ``case_duty_pct``."""
    def run(temp_c: float) -> GpuOutput:
        return gpu_model.gpu_step(params, load.job, util_pct=load.util_pct, limit_w=limit_w, temp_c=temp_c,
                                  was_slowdown=state.slowdown, draw_w=load.draw_w, scale=load.scale,
                                  lock_mhz=lock_mhz, jitter=load.jitter)

    out = run(state.temp_c)
    die = state.sink_c + cooling.die_k_per_w * out.power_w
    for _ in range(3):  # the driver reacts within milliseconds: the die's own jump counts this step
        if die < params.slowdown_temp_c and not out.slowdown:
            break
        out = run(max(state.temp_c, die))
        die = state.sink_c + cooling.die_k_per_w * out.power_w
    state.slowdown = out.slowdown
    auto = gpu_model.firmware_fan_pct(state.temp_c, spinning=state.spinning, target_temp_c=target_temp_c)
    state.spinning = auto > 0
    if fan_duties is None:
        airflow = case_duty_pct
    else:
        duties = [auto if d is None else d for d in fan_duties]
        airflow = sum(duties) / len(duties) if duties else case_duty_pct
    state.sink_c = thermal.step_temperature_c(cooling.sink, state.sink_c, power_w=out.power_w,
                                              duty_pct=airflow, air_c=air_c, dt_s=dt_s)
    state.temp_c = state.sink_c + cooling.die_k_per_w * out.power_w
    state.energy_j += out.power_w * dt_s
    state.work += out.work * dt_s
    state.peak_temp_c = max(state.peak_temp_c, state.temp_c)
    state.slowdown_s += dt_s if out.slowdown else 0.0
    state.fan_duty_pct = airflow
    return out, auto


@dataclass
class SimGpu:
    """The physics of one simulated card and its stock twin, with their running totals."""

    profile: GpuProfile
    params: GpuParams
    cooling: GpuCooling
    card: CardState
    twin: CardState
    fans: int
    limit_changes: list[tuple[float, float, float]] = field(default_factory=list)  # (t_s, old_w, new_w)
    last_limit_w: float | None = None

    @classmethod
    def create(cls, profile: GpuProfile, limit_w: float | None) -> SimGpu:
        params = GpuParams.from_profile(profile)
        cooling = gpu_cooling(profile)
        start = profile.temp_c if profile.temp_c is not None else 35.0
        sink = start - cooling.die_k_per_w * params.idle_w
        return cls(profile, params, cooling, CardState(sink, start), CardState(sink, start),
                   fans=len(profile.fan_speeds_pct), last_limit_w=limit_w)

    # the machine's summary and older callers read these off the card
    @property
    def temp_c(self) -> float:
        return self.card.temp_c

    @property
    def energy_j(self) -> float:
        return self.card.energy_j

    @property
    def work(self) -> float:
        return self.card.work

    @property
    def peak_temp_c(self) -> float:
        return self.card.peak_temp_c

    @property
    def slowdown_s(self) -> float:
        return self.card.slowdown_s

    @property
    def fan_duty_pct(self) -> float:
        return self.card.fan_duty_pct

    def step_twin(self, load: GpuLoad, case_duty_pct: float, air_c: float, dt_s: float) -> None:
        """The stock twin: default limit, no lock, fans automatic."""
        step_card(self.params, self.cooling, self.twin, load, limit_w=self.params.default_w, lock_mhz=None,
                  fan_duties=[None] * self.fans if self.fans else None, case_duty_pct=case_duty_pct,
                  air_c=air_c, dt_s=dt_s, target_temp_c=self.profile.target_temp_c or 84.0)

    def totals(self) -> dict[str, float]:
        """Work per kJ of the card and of its stock twin, the gain (%) and the slowdown (%)."""
        wpk = 1000.0 * self.card.work / self.card.energy_j if self.card.energy_j else 0.0
        stock = 1000.0 * self.twin.work / self.twin.energy_j if self.twin.energy_j else 0.0
        return {"work_per_kj": round(wpk, 4), "stock_work": round(self.twin.work, 2),
                "stock_energy_j": round(self.twin.energy_j, 1), "stock_work_per_kj": round(stock, 4),
                "work_per_j_gain_pct": round(100.0 * (wpk / stock - 1.0), 2) if stock else 0.0,
                "slowdown_pct": round(100.0 * (1.0 - self.card.work / self.twin.work), 2)
                if self.twin.work > 0 else 0.0}
