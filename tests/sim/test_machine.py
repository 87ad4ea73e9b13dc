"""The simulated machine stepped on its own (no daemon): GPUs through the real pynvml bindings over the
fake NVML, the board through its files."""

import pytest

from aithermd.sim.board import NCT
from aithermd.sim.machine import SimulatedMachine, default_profiles
from aithermd.sim.profiles import shipped_profiles
from aithermd.sim.workload import CycleWorkload


@pytest.fixture
def machine(tmp_path):
    m = SimulatedMachine(tmp_path / "m", seed=1)
    yield m
    m.close()


def run(m, seconds, dt=1.0):
    for _ in range(int(seconds / dt)):
        m.step(dt)


def test_default_machine_has_a_card_that_can_be_raised_and_one_that_cannot():
    a, b = default_profiles()
    assert a.max_power_limit_w > a.default_power_limit_w
    assert b.max_power_limit_w == b.default_power_limit_w


def test_nvml_reads_what_the_physics_did(machine):
    nvml = machine.nvml.bindings()
    nvml.nvmlInit()
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(0)
        idle_temp = nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        run(machine, 300)  # 2 min idle, 3 min training
        assert nvml.nvmlDeviceGetUtilizationRates(h).gpu >= 30
        # the job's own draw, well under the 450 W default (jobs draw 0.2–0.97 of it: the Zeus sweeps)
        job = machine.workload.gpu_load(0, 299).job
        power_w = nvml.nvmlDeviceGetPowerUsage(h) / 1000
        assert 0.8 * job.draw_ratio * 450 < power_w < 1.2 * job.draw_ratio * 450 and power_w < 450
        assert nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) > idle_temp + 10
        e1 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        assert (e1 - e0) / 1000 == pytest.approx(machine.gpus[0].energy_j, rel=0.01)
        assert nvml.nvmlDeviceGetFanSpeed_v2(h, 0) > 0  # the card's own curve spun its fan up
    finally:
        nvml.nvmlShutdown()


def test_a_limit_above_the_own_draw_buys_nothing_and_one_below_it_saves(tmp_path):
    results = {}
    job = CycleWorkload(seed=1).job(0, 200)
    own_mw = int(job.draw_ratio * 450_000)
    for limit in (450_000, 600_000, own_mw):
        m = SimulatedMachine(tmp_path / str(limit), profiles=[shipped_profiles()["rtx4090"]], seed=1)
        nvml = m.nvml.bindings()
        nvml.nvmlInit()
        nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(0), limit)
        run(m, 600)
        results[limit] = m.summary()["gpus"]["gpu0"]
        nvml.nvmlShutdown()
        m.close()
    assert results[600_000]["work"] == pytest.approx(results[450_000]["work"], rel=0.02)
    assert results[600_000]["energy_j"] == pytest.approx(results[450_000]["energy_j"], rel=0.03)
    assert results[600_000]["limit_changes"] == [[0.0, 450.0, 600.0]]
    capped = results[own_mw]  # a cap at the job's own draw (the Zeus sweeps: ~2.5 % slower, ~+9 % work/J)
    assert capped["work"] > 0.94 * results[450_000]["work"]
    assert capped["work_per_kj"] > 1.015 * results[450_000]["work_per_kj"]  # 4 of its 10 minutes idle


def test_a_fan_under_manual_control_keeps_its_target(machine):
    nvml = machine.nvml.bindings()
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceSetFanSpeed_v2(h, 0, 100)
    run(machine, 240)
    assert machine.gpus[1].fan_duty_pct == 100
    hot = machine.gpus[1].temp_c
    nvml.nvmlDeviceSetFanSpeed_v2(h, 0, 30)
    run(machine, 120)
    assert machine.gpus[1].temp_c > hot + 5  # less airflow, hotter card
    nvml.nvmlShutdown()


def test_driver_slowdown_protects_a_card_whose_fan_is_stopped(tmp_path):
    m = SimulatedMachine(tmp_path / "m", profiles=[shipped_profiles()["rtx4090"]],
                         workload=CycleWorkload(idle_before_s=0, training_s=1200, idle_after_s=0))
    nvml = m.nvml.bindings()
    nvml.nvmlInit()
    nvml.nvmlDeviceSetFanSpeed_v2(nvml.nvmlDeviceGetHandleByIndex(0), 0, 0)
    run(m, 1200)
    g = m.summary()["gpus"]["gpu0"]
    assert g["slowdown_s"] > 0
    assert g["peak_temp_c"] < g["slowdown_temp_c"] + 5  # the driver holds it near its threshold
    nvml.nvmlShutdown()
    m.close()


def test_manual_pwm_changes_are_counted(machine):
    root = machine.sysfs_root / NCT
    (root / "pwm1_enable").write_text("1")
    for raw in ("100", "100", "150", "90"):
        (root / "pwm1").write_text(raw)
        machine.step(1.0)
    assert [c[2] for c in machine.fan_changes] == [100, 150, 90]


def test_summary_totals(machine):
    run(machine, 600)
    s = machine.summary()
    assert s["duration_s"] == 600 and s["phase_s"] == {"idle": 240.0, "training": 360.0}
    assert s["energy_j"] == pytest.approx(s["gpu_energy_j"] + s["cpu_energy_j"], abs=0.2)
    assert s["work"] == pytest.approx(sum(g["work"] for g in s["gpus"].values()), abs=0.02)
    assert 300 < s["gpus"]["gpu0"]["work"] < 360
    assert s["peak_case_c"] > 28 and s["peak_cpu_c"] > 35


def test_same_seed_same_run(tmp_path):
    sums = []
    for name in ("a", "b"):
        m = SimulatedMachine(tmp_path / name, seed=7)
        run(m, 200)
        sums.append(m.summary())
        m.close()
    assert sums[0] == sums[1]


def test_step_must_move_forward(machine):
    with pytest.raises(ValueError):
        machine.step(0)
