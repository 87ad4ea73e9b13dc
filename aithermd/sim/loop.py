"""One simulated GPU and the pure policy engine in a closed loop, at 1 Hz, without the daemon's I/O.

What the benchmarks and the control-quality tests run many times: the calibrated card
(:mod:`aithermd.sim.gpu_sim`, its stock twin beside it) under a workload, the real engine
(:func:`aithermd.policy.engine.evaluate`) reading what NVML would show — temperature, power, utilization,
memory utilization, SM clock, clock-event reasons, GPM tensor activity on Hopper-class cards and, when the
job reports it (``progress``), its progress rate — and its power-limit decision applied the next second,
as the daemon's tick does. ``static_w`` instead holds one limit the whole run (the baselines).

The job's progress rate, when reported, is what a training loop prints: whole steps completed per second
(:data:`STEPS_PER_WORK` at full speed), read over each 1 s sample, so a single reading is coarse and a
window of them exact.

Every run of one job sees the same loads and the same stock twin (neither depends on what the engine
does): :func:`prepare` computes them once, and the benchmarks hand the result to each run of that job
(``prepared``) instead of stepping the workload and the twin again for every baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, KnobValue, Quantity, Reading
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.gpu_sim import SimGpu, step_card
from aithermd.sim.workload import GpuLoad, Workload

STEPS_PER_WORK = 3.0  # training steps per second of full-speed work (a typical it/s of a training loop)
CASE_AIR_C = 30.0  # intake air of the cards (the simulated X570 case under load: 29–31 °C)
CASE_DUTY_PCT = 45.0  # chassis fans for passive boards (the shipped board curve at ~60 °C)


def gpu_device(index: int, profile: GpuProfile, *, gpm: bool, progress: bool) -> Device:
    """``gpu<index>`` with the channels the NVML backend (and the progress feed) give it."""
    dev = f"gpu{index}"
    thresholds = {k: v for k, v in (("slowdown", profile.slowdown_temp_c),
                                    ("shutdown", profile.shutdown_temp_c)) if v is not None}
    chans = [Channel(f"{dev}/temperature", dev, "temperature", Quantity.TEMPERATURE, "°C",
                     thresholds=thresholds),
             Channel(f"{dev}/power", dev, "power", Quantity.POWER, "W"),
             Channel(f"{dev}/utilization", dev, "utilization", Quantity.UTILIZATION, "%"),
             Channel(f"{dev}/memory_utilization", dev, "memory_utilization", Quantity.UTILIZATION, "%"),
             Channel(f"{dev}/sm_clock", dev, "sm_clock", Quantity.CLOCK, "MHz")]
    if gpm:
        chans.append(Channel(f"{dev}/tensor_activity", dev, "tensor_activity", Quantity.UTILIZATION, "%"))
    if progress:
        chans.append(Channel(f"{dev}/progress_rate", dev, "progress_rate", Quantity.LOAD, "1/s"))
    knob = Knob(f"{dev}/power_limit", dev, KnobKind.POWER_LIMIT, "W", profile.min_power_limit_w,
                profile.max_power_limit_w, profile.default_power_limit_w, writable=True)
    top = float(profile.max_sm_clock_mhz or 2000.0)
    lock = Knob(f"{dev}/sm_clock_lock", dev, KnobKind.SM_CLOCK_LOCK, "MHz", 210.0, top, top, writable=True)
    fans = tuple(Knob(f"{dev}/fan{i}", dev, KnobKind.FAN, "%", 0.0, 100.0, None, writable=False,
                      why_not="the loop leaves the card's fans to it")
                 for i in range(len(profile.fan_speeds_pct)))
    return Device(dev, DeviceKind.GPU, profile.name, tuple(chans), (knob, lock, *fans),
                  info={"uuid": f"GPU-sim-{index}"})


@dataclass
class LoopResult:
    """Totals of one run: the card's and its stock twin's energy (J) and work, over the whole run and
    over its busy seconds; every limit change ``(t_s, old_w, new_w, rule, reason)``; seconds per policy
    state; the safety layer's limit changes."""

    energy_j: float = 0.0
    work: float = 0.0
    stock_energy_j: float = 0.0
    stock_work: float = 0.0
    busy_energy_j: float = 0.0
    busy_work: float = 0.0
    busy_stock_energy_j: float = 0.0
    busy_stock_work: float = 0.0
    changes: list[tuple[float, float, float, str, str]] = field(default_factory=list)
    clock_changes: list[tuple[float, float, float, str, str]] = field(default_factory=list)
    states_s: dict[str, float] = field(default_factory=dict)
    safety_changes: int = 0
    peak_temp_c: float = 0.0
    last_inputs: dict[str, Any] = field(default_factory=dict)
    held_first_s: float | None = None  # when the engine first found the card held high while idle
    held_w: float = 0.0  # what it drew then
    held_recovered_w: float = 0.0  # what a clock lock took off it since (the last held tick)

    def gain_pct(self, busy: bool = True) -> float:
        """Work per joule against the stock twin, %."""
        e, w, se, sw = ((self.busy_energy_j, self.busy_work, self.busy_stock_energy_j, self.busy_stock_work)
                        if busy else (self.energy_j, self.work, self.stock_energy_j, self.stock_work))
        return 100.0 * ((w / e) / (sw / se) - 1.0) if e > 0 and se > 0 and sw > 0 else 0.0

    def slowdown_pct(self, busy: bool = True) -> float:
        w, sw = (self.busy_work, self.busy_stock_work) if busy else (self.work, self.stock_work)
        return 100.0 * (1.0 - w / sw) if sw > 0 else 0.0


@dataclass(frozen=True)
class Prepared:
    """One job's seconds as every run of it sees them: the workload's load of each second and the stock
    twin's running totals after it (energy J, work), for ``duration_s`` seconds of GPU ``index``."""

    profile: GpuProfile
    duration_s: float
    index: int
    loads: tuple[GpuLoad, ...]
    twin: tuple[tuple[float, float], ...]


def prepare(profile: GpuProfile, workload: Workload, duration_s: float, index: int = 0) -> Prepared:
    """Step ``workload`` and the stock twin of ``profile`` once over ``duration_s`` (1 s steps)."""
    gpu = SimGpu.create(profile, profile.default_power_limit_w)
    loads, twin = [], []
    t = 0.0
    while t < duration_s - 1e-9:
        load = workload.gpu_load(index, t)
        gpu.step_twin(load, CASE_DUTY_PCT, CASE_AIR_C, 1.0)
        loads.append(load)
        twin.append((gpu.twin.energy_j, gpu.twin.work))
        t += 1.0
    return Prepared(profile, duration_s, index, tuple(loads), tuple(twin))


def run(profile: GpuProfile, workload: Workload | None, duration_s: float, *, policy: Any = None,
        static_w: float | None = None, static_lock_mhz: float | None = None, progress: bool = False,
        index: int = 0, prepared: Prepared | None = None) -> LoopResult:
    """Run ``duration_s`` seconds of ``workload`` (its GPU ``index``) on one card, under ``policy`` (a
    loaded :class:`~aithermd.policy.loader.Policy`) or a fixed ``static_w`` limit and ``static_lock_mhz``
    SM clock lock (neither: stock). ``progress``: the job reports its progress rate. ``prepared``: the
    same job's loads and stock twin from :func:`prepare` (then ``workload`` may be None); raises
    ``ValueError`` when they were prepared for another card, GPU or duration."""
    from aithermd.policy.engine import EngineInput, evaluate, initial_state

    if prepared is None:
        if workload is None:
            raise ValueError("run() needs a workload or a prepared job")
        prepared = prepare(profile, workload, duration_s, index)
    elif (prepared.profile is not profile or prepared.index != index
          or abs(prepared.duration_s - duration_s) > 1e-9):
        raise ValueError("the prepared job is for another card, GPU or duration")
    gpu = SimGpu.create(profile, profile.default_power_limit_w)
    params = gpu.params
    device = gpu_device(index, profile, gpm=params.gpm, progress=progress)
    kid, cid = f"gpu{index}/power_limit", f"gpu{index}/sm_clock_lock"
    knob, lock_knob = device.knobs[:2]
    top = lock_knob.max or params.max_clock_mhz
    limit = static_w if static_w is not None else params.default_w
    lock: float | None = static_lock_mhz
    res = LoopResult()
    state = initial_state()
    steps_done = 0.0
    t = 0.0
    twin_prev = (0.0, 0.0)
    for load, twin_now in zip(prepared.loads, prepared.twin, strict=True):
        out, _auto = step_card(params, gpu.cooling, gpu.card, load, limit_w=limit, lock_mhz=lock,
                               fan_duties=[None] * gpu.fans if gpu.fans else None,
                               case_duty_pct=CASE_DUTY_PCT, air_c=CASE_AIR_C, dt_s=1.0,
                               target_temp_c=profile.target_temp_c or 84.0)
        (twin_e, twin_w), twin_prev = twin_prev, twin_now
        busy = load.job is not None and load.job.kind != "idle" and load.util_pct > 0
        res.energy_j += out.power_w
        res.work += out.work
        res.stock_energy_j, res.stock_work = twin_now
        if busy:
            res.busy_energy_j += out.power_w
            res.busy_work += out.work
            res.busy_stock_energy_j += twin_now[0] - twin_e
            res.busy_stock_work += twin_now[1] - twin_w
        res.peak_temp_c = max(res.peak_temp_c, gpu.card.temp_c)
        t += 1.0
        if policy is None:
            continue
        before = steps_done
        steps_done += out.work * STEPS_PER_WORK
        dev = device.id
        readings = {f"{dev}/temperature": Reading(f"{dev}/temperature", float(round(gpu.card.temp_c))),
                    f"{dev}/power": Reading(f"{dev}/power", out.power_w),
                    f"{dev}/utilization": Reading(f"{dev}/utilization", float(round(out.util_pct))),
                    f"{dev}/memory_utilization": Reading(f"{dev}/memory_utilization",
                                                         float(round(out.memory_util_pct))),
                    f"{dev}/sm_clock": Reading(f"{dev}/sm_clock", float(out.sm_clock_mhz))}
        if out.gpm_tensor_pct is not None:
            readings[f"{dev}/tensor_activity"] = Reading(f"{dev}/tensor_activity", out.gpm_tensor_pct)
        if progress:
            rate = float(math.floor(steps_done) - math.floor(before))
            readings[f"{dev}/progress_rate"] = Reading(f"{dev}/progress_rate", rate)
        inp = EngineInput(t_mono=t, t_wall=1_767_268_800.0 + t, devices=(device,), readings=readings,
                          knobs={kid: KnobValue(kid, limit),
                                 cid: KnobValue(cid, top if lock is None else lock)},
                          attrs={dev: {"clock_event_reasons": out.reasons, "pstate": out.pstate}})
        result = evaluate(policy, (), inp, state)
        state = result.state
        for st in result.states.get(policy.name, {}).values():
            res.states_s[st] = res.states_s.get(st, 0.0) + 1.0
        dec = result.decisions.get(kid)
        new = dec.value if dec is not None and dec.value is not None else params.default_w
        new = knob.clamp(new)
        if abs(new - limit) > 1e-6:
            res.changes.append((t, limit, new, dec.rule if dec else "default", dec.reason if dec else ""))
            if dec is not None and dec.rule.startswith("safety/"):
                res.safety_changes += 1
            limit = new
        if dec is not None:
            res.last_inputs = dict(dec.inputs)
        cdec = result.decisions.get(cid)
        want = lock_knob.clamp(cdec.value) if cdec is not None and cdec.value is not None else top
        new_lock = None if want >= top else want
        if new_lock != lock:
            res.clock_changes.append((t, top if lock is None else lock, want,
                                      cdec.rule if cdec else "default", cdec.reason if cdec else ""))
            lock = new_lock
            if cdec is not None:
                res.last_inputs = dict(cdec.inputs)
        h = result.held_idle.get(dev)
        if h is not None:
            if res.held_first_s is None:
                res.held_first_s, res.held_w = t, h.held_w
            res.held_recovered_w = h.recovered_w
    return res
