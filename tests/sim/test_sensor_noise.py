"""Sensor noise: readings quantized and jittered as real sensors report them, seeded, apart from the truth."""

import statistics

import pytest

from aithermd.sim import sensor_noise as sn
from aithermd.sim.machine import SimulatedMachine
from aithermd.sim.sensor_noise import SensorNoise
from aithermd.sim.workload import CycleWorkload

TRAINING_ONLY = CycleWorkload(idle_before_s=0, training_s=3600, idle_after_s=0, seed=1)


@pytest.mark.parametrize(("sensor", "step_mc"), [
    (sn.NVML_GPU, 1000), (sn.K10TEMP, 125), (sn.NCT_SYSTIN, 1000), (sn.NCT_HALF_DEGREE, 500),
    (sn.AMDGPU_EDGE, 1000)])
def test_readings_come_in_the_sensors_own_steps(sensor, step_mc):
    noise = SensorNoise(0, "t")
    readings = {noise.temp_mc(sensor, 61.37, load=1.0) for _ in range(500)}
    assert all(r % step_mc == 0 for r in readings)
    assert len(readings) > 1  # and they jitter


def test_the_same_seed_gives_the_same_readings_and_another_seed_others():
    def draw(seed, stream="board"):
        noise = SensorNoise(seed, stream)
        return [noise.temp_c(sn.NVML_GPU, 65.4, load=1.0) for _ in range(50)] + [noise.rpm(1200.0)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    assert draw(3, "gpu") != draw(3, "board")


def test_gpu_jitter_grows_with_load_as_the_recorded_trace_shows():
    noise = SensorNoise(7, "gpu")
    busy = [noise.temp_c(sn.NVML_GPU, 65.3, load=1.0) for _ in range(4000)]
    idle = [noise.temp_c(sn.NVML_GPU, 35.2, load=0.0) for _ in range(4000)]
    assert statistics.fmean(busy) == pytest.approx(65.3, abs=0.15)
    assert statistics.pstdev(busy) == pytest.approx(2.0, abs=0.15)  # 2.0 °C measured under training load
    assert statistics.pstdev(idle) < 0.3  # an idle card holds one integer (residual std 0.006 °C)
    assert idle.count(35.0) > 0.9 * len(idle)


def test_fan_rpm_jitters_about_one_percent_and_a_stopped_fan_reads_zero():
    noise = SensorNoise(1, "board")
    rpms = [noise.rpm(1500.0) for _ in range(2000)]
    assert all(isinstance(r, int) for r in rpms)
    assert statistics.fmean(rpms) == pytest.approx(1500.0, abs=2.0)
    assert statistics.pstdev(rpms) == pytest.approx(7.5, abs=1.0)  # sigma 0.5 %
    assert max(abs(r - 1500) for r in rpms) < 0.03 * 1500
    assert noise.rpm(0.0) == 0


def test_noise_off_quantizes_only():
    noise = SensorNoise(0, "t", enabled=False)
    assert noise.temp_mc(sn.K10TEMP, 61.37, load=1.0) == 61375
    assert noise.temp_c(sn.NVML_GPU, 65.6, load=1.0) == 66.0
    assert noise.rpm(1234.4) == 1234


def test_the_physics_keep_the_truth_and_only_the_readings_are_noisy(tmp_path):
    noisy = SimulatedMachine(tmp_path / "noisy", workload=TRAINING_ONLY, seed=5)
    clean = SimulatedMachine(tmp_path / "clean", workload=TRAINING_ONLY, seed=5, sensor_noise=False)
    off_by = []
    try:
        for _ in range(300):
            noisy.step(1.0)
            clean.step(1.0)
            off_by.append(noisy.nvml.gpu(0).temp_c - round(noisy.gpus[0].temp_c))
            assert clean.nvml.gpu(0).temp_c == round(clean.gpus[0].temp_c)
        # no daemon: what the sensors report feeds nothing back, so the true state is the same
        assert [g.temp_c for g in noisy.gpus] == [g.temp_c for g in clean.gpus]
        assert noisy.board.cpu_sink_c == clean.board.cpu_sink_c
        assert noisy.summary()["gpus"] == clean.summary()["gpus"]
        assert all(float(x).is_integer() for x in off_by)  # NVML reports whole degrees
        assert max(abs(x) for x in off_by[-120:]) >= 2  # under load the reading scatters around the truth
    finally:
        noisy.close()
        clean.close()
