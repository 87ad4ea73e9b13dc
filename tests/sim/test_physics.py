"""The pure physics: the lumped thermal model and the GPU power/performance model."""

import math

import pytest

from aithermd.sim import gpu_model, thermal
from aithermd.sim.gpu_model import GpuParams
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.jobs import DECODE, IDLE, TRAINING, Job
from aithermd.sim.law import JobLaw

P = thermal.ThermalParams(heat_capacity_j_per_k=1000.0, g_passive_w_per_k=2.0, g_fan_w_per_k=13.0)


def test_resistance_falls_as_the_fan_speeds_up():
    rs = [thermal.thermal_resistance_k_per_w(P, d) for d in (0, 20, 40, 60, 80, 100)]
    assert rs == sorted(rs, reverse=True) and len(set(rs)) == 6
    assert rs[0] == pytest.approx(0.5)
    assert rs[-1] == pytest.approx(1 / 15)


def test_steady_state_is_air_plus_power_times_resistance():
    assert thermal.steady_state_c(P, power_w=450, duty_pct=100, air_c=30) == pytest.approx(60.0)


def test_step_is_the_exact_exponential_and_independent_of_step_size():
    one = thermal.step_temperature_c(P, 30.0, power_w=450, duty_pct=100, air_c=30, dt_s=100.0)
    tau = 1000.0 / 15.0
    assert one == pytest.approx(60.0 + (30.0 - 60.0) * math.exp(-100.0 / tau))
    t = 30.0
    for _ in range(100):
        t = thermal.step_temperature_c(P, t, power_w=450, duty_pct=100, air_c=30, dt_s=1.0)
    assert t == pytest.approx(one)


def test_huge_steps_settle_at_the_steady_state_without_overshoot():
    t = thermal.step_temperature_c(P, 30.0, power_w=450, duty_pct=100, air_c=30, dt_s=1e6)
    assert t == pytest.approx(60.0)


def test_cooling_toward_the_air_with_no_power():
    t = thermal.step_temperature_c(P, 80.0, power_w=0, duty_pct=50, air_c=25, dt_s=30)
    assert 25.0 < t < 80.0


@pytest.mark.parametrize("kw", [dict(heat_capacity_j_per_k=0, g_passive_w_per_k=1, g_fan_w_per_k=1),
                                dict(heat_capacity_j_per_k=1, g_passive_w_per_k=0, g_fan_w_per_k=1),
                                dict(heat_capacity_j_per_k=1, g_passive_w_per_k=1, g_fan_w_per_k=-1)])
def test_invalid_constants_are_refused(kw):
    with pytest.raises(ValueError):
        thermal.ThermalParams(**kw)


def test_negative_step_is_refused():
    with pytest.raises(ValueError):
        thermal.step_temperature_c(P, 30, power_w=1, duty_pct=1, air_c=1, dt_s=-1)


def test_design_point_constants_meet_their_steady_states():
    p = thermal.ThermalParams.from_design_point(power_w=450, rise_at_full_fan_k=30, rise_passive_at_w=27,
                                                passive_rise_k=12, time_constant_s=100)
    assert thermal.steady_state_c(p, power_w=450, duty_pct=100, air_c=0) == pytest.approx(30)
    assert thermal.steady_state_c(p, power_w=27, duty_pct=0, air_c=0) == pytest.approx(12)


G = GpuParams(idle_w=30.0, default_w=450.0, slowdown_temp_c=85.0, max_clock_mhz=2520.0)
JOB = Job(TRAINING, 0.7, JobLaw(1.0, 0.78), mem_frac=0.4)  # draws 315 W when nothing binds (median s)


def step(**kw):
    args = dict(util_pct=100, limit_w=450, temp_c=60)
    args.update(kw)
    job = args.pop("job", JOB)
    return gpu_model.gpu_step(G, job, **args)


def test_a_job_draws_its_own_demand_whatever_the_limit_above_it():
    assert step().power_w == pytest.approx(315, rel=0.02)
    assert step(limit_w=600).power_w == pytest.approx(step(limit_w=450).power_w, rel=3e-3)
    assert step(limit_w=600).work == pytest.approx(1.0, abs=1e-3)  # no gain above its own draw
    assert step(util_pct=0).power_w == pytest.approx(30)
    assert step(util_pct=50).power_w == pytest.approx(30 + 0.5 * 285, rel=0.02)
    assert step(draw_w=280.0).power_w == pytest.approx(280.0, rel=0.01)  # a trace's own draw


def test_a_cap_at_the_own_draw_costs_little_and_saves_more():
    free, capped = step(), step(limit_w=315)
    slow = 1 - capped.work / free.work
    gain = (capped.work / capped.power_w) / (free.work / free.power_w) - 1
    assert 0.005 < slow < 0.05 and gain > 0.04
    deep = step(limit_w=150)
    assert deep.work < capped.work and deep.power_w < capped.power_w


def test_throughput_falls_monotonically_and_faster_past_the_knee():
    limits = [100, 150, 200, 250, 300, 350, 450]
    works = [step(limit_w=w).work for w in limits]
    assert works == sorted(works)
    per_w_above = (works[-2] - works[-3]) / 50
    per_w_below = (works[1] - works[0]) / 50
    assert per_w_below > 2 * per_w_above  # the knee at deep caps


def test_reasons():
    assert gpu_model.SW_POWER_CAP in step(limit_w=200).reasons
    assert step(util_pct=0).reasons == (gpu_model.GPU_IDLE,)
    assert step(limit_w=600).reasons == ()


def test_thermal_slowdown_halves_then_shrinks_toward_shutdown():
    hot = step(temp_c=85)
    assert hot.slowdown and gpu_model.HW_THERMAL_SLOWDOWN in hot.reasons
    assert hot.power_w < step().power_w
    hotter = step(temp_c=88)  # shutdown at 85 + 5 by default
    assert hotter.power_w < hot.power_w
    assert step(temp_c=95).power_w == pytest.approx(30)
    assert hot.work < step(temp_c=80).work
    assert step(temp_c=83, was_slowdown=True).slowdown
    assert not step(temp_c=83, was_slowdown=False).slowdown
    assert not step(temp_c=81.9, was_slowdown=True).slowdown


def test_visible_clock_overstates_the_slowdown_of_a_memory_bound_job():
    compute = Job(TRAINING, 0.7, JobLaw(1.0, 0.78), mem_frac=0.0)
    memory = Job(TRAINING, 0.7, JobLaw(1.0, 0.78), mem_frac=0.6)
    # the hidden memory-bound fraction does not change the work (the law does), only what the clock shows
    assert step(job=memory, limit_w=250).work == pytest.approx(step(job=compute, limit_w=250).work, rel=1e-9)
    c = step(job=compute, limit_w=250)
    m = step(job=memory, limit_w=250)
    assert c.sm_clock_mhz / 2520 == pytest.approx(c.work, abs=1e-3)  # compute-bound: the clock is the work
    assert m.sm_clock_mhz / 2520 < m.work - 0.03  # memory-bound: the clock falls further than the work
    assert step(util_pct=0).sm_clock_mhz == 210


def test_gpm_tensor_activity_times_the_clock_tracks_the_work():
    hopper = GpuParams(idle_w=70.0, default_w=700.0, slowdown_temp_c=90.0, max_clock_mhz=1980.0, gpm=True)
    outs = [gpu_model.gpu_step(hopper, JOB, util_pct=100, limit_w=w, temp_c=50) for w in (700, 450, 350)]
    tracked = [o.gpm_tensor_pct * o.sm_clock_mhz for o in outs]
    assert tracked[1] / tracked[0] == pytest.approx(outs[1].work / outs[0].work, rel=0.01)
    assert tracked[2] / tracked[0] == pytest.approx(outs[2].work / outs[0].work, rel=0.01)
    assert step().gpm_tensor_pct is None  # no GPM before Hopper


def test_a_clock_lock_holds_a_decode_job_cheaply():
    decode = Job(DECODE, 0.3, mem_frac=0.995, sm_share=0.4)
    free = step(job=decode)
    locked = step(job=decode, lock_mhz=600)
    assert locked.work / free.work > 0.97
    assert locked.power_w < 0.8 * free.power_w
    assert step(job=decode, limit_w=450).power_w == pytest.approx(free.power_w)  # stock cap never binds


def test_held_high_idle_draws_above_the_floor_until_the_clock_is_locked():
    held = Job(IDLE, 0.0, held_ratio=2.0, held_sm_share=0.5)
    out = step(job=held, util_pct=0)
    assert out.power_w == pytest.approx(60.0) and out.pstate == "P0" and out.work == 0
    assert step(job=held, util_pct=0, lock_mhz=210).power_w == pytest.approx(45.0)
    assert step(job=None, util_pct=0).pstate == "P8"


def test_params_from_a_profile():
    prof = GpuProfile(name="x", pci_bus_id="0", default_power_limit_w=450, power_draw_w=26.84,
                      slowdown_temp_c=None, target_temp_c=84.0, max_sm_clock_mhz=3120)
    p = GpuParams.from_profile(prof)
    assert (p.idle_w, p.default_w, p.slowdown_temp_c, p.max_clock_mhz) == (26.84, 450, 87.0, 3120)
    assert not p.gpm
    busy = GpuProfile(name="x", pci_bus_id="0", default_power_limit_w=350, power_draw_w=183.0,
                      slowdown_temp_c=90, architecture="Hopper")
    assert GpuParams.from_profile(busy).idle_w == pytest.approx(35.0)  # a passive board: 10 % of its default
    fans = GpuProfile(name="x", pci_bus_id="0", default_power_limit_w=350, power_draw_w=183.0,
                      fan_speeds_pct=(30.0,))
    assert GpuParams.from_profile(fans).idle_w == pytest.approx(21.0)  # a card with fans: 6 %
    assert GpuParams.from_profile(busy).slowdown_temp_c == 90
    assert GpuParams.from_profile(busy).gpm
    with pytest.raises(ValueError):
        GpuParams.from_profile(GpuProfile(name="x", pci_bus_id="0"))


def test_firmware_fan_curve_has_zero_rpm_idle_with_hysteresis():
    f = gpu_model.firmware_fan_pct
    assert f(40, spinning=False) == 0 and f(49.9, spinning=False) == 0
    assert f(50, spinning=False) == 30
    assert f(47, spinning=True) == 30 and f(44.9, spinning=True) == 0
    assert f(80, spinning=True) == 100 and f(95, spinning=True) == 100
    assert 30 < f(65, spinning=True) < 100
