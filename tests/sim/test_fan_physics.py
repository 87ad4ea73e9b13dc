"""The simulated board's fans turn as real ones do (aithermd/sim/fans.py): inertia, a start threshold above
the stop threshold, one pwm driving two fans, empty headers, a driver keeping whole percents, a fan that
dies. These are what fan detection and calibration must find."""

from __future__ import annotations

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.sim.board import AMDGPU, NCT, Board
from aithermd.sim.fans import SPIN_UP_S, amdgpu_level


@pytest.fixture
def board(tmp_path):
    b = Board.create(tmp_path / "machine", sensor_noise=False)
    yield b
    b.close()


def manual(board, n, raw, chip=NCT):
    (board.sysfs_root / chip / f"pwm{n}_enable").write_text("1")
    (board.sysfs_root / chip / f"pwm{n}").write_text(f"{raw}")


def rpm(board, n, chip=NCT):
    return int((board.sysfs_root / chip / f"fan{n}_input").read_bytes())


def run(board, seconds, dt=0.5):
    for _ in range(int(seconds / dt)):
        board.step(dt, cpu_util_pct=5, gpu_heat_w=0)


def test_a_fan_takes_time_to_spin_up_and_to_coast_down(board):
    manual(board, 1, 0)
    run(board, 10)
    assert rpm(board, 1) == 0
    manual(board, 1, 255)
    run(board, SPIN_UP_S, dt=SPIN_UP_S)
    top = board.fans["nct6798/fan1"].max_rpm
    assert rpm(board, 1) == pytest.approx(top * (1 - 2.718281828 ** -1), rel=0.02)  # one time constant
    run(board, 10)
    assert rpm(board, 1) == pytest.approx(top, rel=0.01)
    manual(board, 1, 0)
    run(board, 1, dt=1)
    assert 0 < rpm(board, 1) < top  # coasting, still counted by the tach
    run(board, 10)
    assert rpm(board, 1) == 0


def test_a_stopped_fan_needs_its_start_duty_a_running_one_turns_down_to_its_stop_duty(board):
    manual(board, 3, 0)
    run(board, 10)
    manual(board, 3, 64)  # 25 %: above the stop threshold (20 %), below the start threshold (30 %)
    run(board, 10)
    assert rpm(board, 3) == 0
    manual(board, 3, 80)  # 31 %: starts
    run(board, 10)
    assert rpm(board, 3) > 0
    manual(board, 3, 54)  # 21 %: keeps turning, from running
    run(board, 10)
    assert rpm(board, 3) > 0
    manual(board, 3, 48)  # 19 %: below the stop threshold
    run(board, 10)
    assert rpm(board, 3) == 0


def test_pwm2_drives_two_fans_and_pwm5_and_pwm6_drive_none(board):
    for n in range(1, 7):
        manual(board, n, 255)
    run(board, 10)
    before = {n: rpm(board, n) for n in range(1, 7)}
    assert before[6] == 0 and all(before[n] > 0 for n in (1, 2, 3, 4, 5))
    manual(board, 2, 0)
    manual(board, 5, 0)
    manual(board, 6, 0)
    run(board, 10)
    after = {n: rpm(board, n) for n in range(1, 7)}
    assert after[2] == 0 and after[5] == 0  # both fans on pwm2's output
    assert all(after[n] == pytest.approx(before[n], rel=0.01) for n in (1, 3, 4))


def test_a_dead_fan_stops_under_full_duty_and_its_cooling_goes(board):
    manual(board, 4, 255)
    run(board, 5)
    assert rpm(board, 4) > 1500
    flow = board.airflow_pct("case")
    board.kill_fan("nct6798/fan4")
    run(board, 10)
    assert rpm(board, 4) == 0 and board.airflow_pct("case") < flow * 0.8


def test_the_amdgpu_keeps_whole_percents_at_once_through_the_driver_and_at_the_next_step(board, tmp_path):
    assert [amdgpu_level(r) for r in (0, 5, 60, 65, 153, 255)] == [0, 6, 62, 64, 153, 255]
    assert all(amdgpu_level(amdgpu_level(r)) == amdgpu_level(r) for r in range(256))
    hwmon = HwmonBackend(str(board.sysfs_root), io=board.io())
    dev = next(d for d in hwmon.discover() if d.name == "amdgpu")
    hwmon.write_knob(f"{dev.id}/pwm1", 65 / 2.55)  # pwm 65
    assert (board.sysfs_root / AMDGPU / "pwm1").read_text() == "67\n"  # 64 < 65: one level up, kept
    manual(board, 1, 65, chip=AMDGPU)  # a shell writing past the driver model: the next step keeps 64
    board.step(1.0, cpu_util_pct=5, gpu_heat_w=0)
    assert int((board.sysfs_root / AMDGPU / "pwm1").read_bytes()) == 64
    hwmon.close()
