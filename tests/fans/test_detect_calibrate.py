"""Fan detection and calibration on the simulated board, whose fans have real physics and a hidden wiring
(aithermd/sim/fans.py): they must find exactly what the board hides, and leave every pwm as found."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aithermd.actuate.journal import Journal
from aithermd.backends.hwmon import HwmonBackend
from aithermd.clock import FakeClock
from aithermd.fans import calibrate as cal
from aithermd.fans import detect as det
from aithermd.fans.lab import Lab, LabAborted, LabOptions
from aithermd.sim.board import Board
from aithermd.sim.fanlab import sim_sleep
from aithermd.sim.fans import DEFAULT_WIRING, FanSpec, Wiring, amdgpu_level
from tests.backends.drivers import DriverIO
from tests.support.machines import X570, copy_machine

NCT = "hwmon:nct6798-isa-0290"
GPU = "hwmon:amdgpu-pci-0700"


def as_found(before: dict, after: dict) -> bool:
    """Every pwmN_enable as found, and every pwmN in manual mode (or without pwmN_enable) as found; a pwm in
    automatic mode is the chip's own output (it writes its choice there), not ours to compare."""
    def ours(values):
        return {k: v for k, v in values.items()
                if k.endswith("_enable") or values.get(k + "_enable", 1) == 1}
    return ours(before) == ours(after) and before.keys() == after.keys()


class Rig:
    def __init__(self, tmp_path, wiring=DEFAULT_WIRING, cpu_util_pct=5.0, **lab):
        self.board = Board.create(tmp_path / "machine", wiring=wiring, seed=7)
        self.backend = HwmonBackend(str(self.board.sysfs_root), io=self.board.io())
        self.devices = self.backend.discover()
        self.clock = FakeClock()
        self.journal = Journal(tmp_path / "state")
        self.said: list[str] = []
        self.before = self.board.knob_values()
        sleep = sim_sleep(self.board, self.clock, cpu_util_pct=cpu_util_pct)
        self.lab = Lab(self.backend, self.devices, self.journal, clock=self.clock, sleep=sleep,
                       options=LabOptions(**lab), say=self.said.append)
        self.pwms = det.writable_pwms(self.devices)
        self.tachs = det.fan_inputs(self.devices)

    def close(self):
        self.backend.close()
        self.board.close()


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def test_detection_finds_the_hidden_wiring_and_restores_every_pwm(rig):
    with rig.lab as lab:
        found = det.detect(lab, rig.pwms, rig.tachs)
    assert found.followers == {
        f"{GPU}/pwm1": (f"{GPU}/fan1",),
        f"{NCT}/pwm1": (f"{NCT}/fan1",),
        f"{NCT}/pwm2": (f"{NCT}/fan2", f"{NCT}/fan5"),  # CPU_FAN and CPU_OPT on one pwm output
        f"{NCT}/pwm3": (f"{NCT}/fan3",),
        f"{NCT}/pwm4": (f"{NCT}/fan4",),
        f"{NCT}/pwm5": (),  # empty header
        f"{NCT}/pwm6": (),
    }
    assert found.idle == (f"{NCT}/fan6",) and found.free == ()
    lines = det.report(found)
    assert f"{NCT}/pwm5 drives no fan input: an empty header (or a fan without its tach wire)" in lines
    assert "  (pairing by number would have said fan2)" in lines
    assert f"{NCT}/fan6 reads 0 RPM throughout: nothing connected" in lines
    assert as_found(rig.before, rig.board.knob_values()) and not rig.journal.dirty
    assert rig.lab.restored is not None and len(rig.lab.restored.restored) == 7


def test_a_fan_on_fixed_power_follows_no_pwm(tmp_path):
    pump = FanSpec("nct6798/fan6", None, max_rpm=2800.0)  # an AIO pump on SATA power, tach on AIO_PUMP
    r = Rig(tmp_path, wiring=Wiring(fans=(*DEFAULT_WIRING.fans, pump), levels=DEFAULT_WIRING.levels))
    try:
        with r.lab as lab:
            found = det.detect(lab, r.pwms, r.tachs)
        assert found.free == (f"{NCT}/fan6",) and found.idle == ()
        assert f"{NCT}/fan6" not in {t for ts in found.followers.values() for t in ts}
    finally:
        r.close()


def test_calibration_finds_each_fans_start_and_stop_duty_and_the_drivers_levels(rig):
    with rig.lab as lab:
        found = det.detect(lab, rig.pwms, rig.tachs)
        setup = cal.calibrate(lab, found.setup(rig.clock.wall()), [f"{NCT}/pwm2", f"{NCT}/pwm3",
                                                                   f"{NCT}/pwm5", f"{GPU}/pwm1"], 1.0)
    cpu, case, gpu = setup.pwms[f"{NCT}/pwm2"], setup.pwms[f"{NCT}/pwm3"], setup.pwms[f"{GPU}/pwm1"]
    step = 100 / 255
    # the board's hidden thresholds: CPU cooler start 25 % / stop 15 %, case fan 30 % / 20 %
    assert 15.0 <= cpu.stop_pct <= 15.0 + step and 25.0 <= cpu.start_pct <= 25.0 + step
    assert 20.0 <= case.stop_pct <= 20.0 + step and 30.0 <= case.start_pct <= 30.0 + step
    assert cpu.calibrated and set(cpu.rpm) == {f"{NCT}/fan2", f"{NCT}/fan5"}
    top = dict(cpu.rpm[f"{NCT}/fan5"])[100.0]
    assert top == pytest.approx(1500, rel=0.03)
    assert case.levels == () and cpu.levels == ()
    assert gpu.levels == tuple(sorted({amdgpu_level(r) for r in range(256)}))  # 101 whole percents
    assert 12.0 <= gpu.stop_pct <= 13.0 and 20.0 <= gpu.start_pct <= 21.0
    assert not setup.pwms[f"{NCT}/pwm5"].calibrated  # nothing to calibrate on an empty header
    assert as_found(rig.before, rig.board.knob_values()) and not rig.journal.dirty


def test_a_temperature_rising_past_the_margin_aborts_and_restores(tmp_path):
    r = Rig(tmp_path, cpu_util_pct=100.0, margin_c=3.0)
    try:
        with pytest.raises(LabAborted, match="more than 3 °C above"), r.lab as lab:
            det.detect(lab, r.pwms, r.tachs)
        assert as_found(r.before, r.board.knob_values()) and not r.journal.dirty
    finally:
        r.close()


def test_the_time_limit_aborts_and_restores(tmp_path):
    r = Rig(tmp_path, time_limit_s=20.0)
    try:
        with pytest.raises(LabAborted, match="time limit of 20 s"), r.lab as lab:
            det.detect(lab, r.pwms, r.tachs)
        assert as_found(r.before, r.board.knob_values()) and not r.journal.dirty
    finally:
        r.close()


def test_fans_that_follow_no_pwm_at_all_are_not_stored_as_empty_headers(tmp_path):
    """Every fan keeps its speed whatever the pwm outputs do (all on fixed power, or a BIOS that keeps
    control): not seven empty headers (which would leave every fan unwatched by stall detection), but a
    detection that must not be stored, saying why."""
    fixed = Wiring(fans=tuple(replace(f, pwm=None) for f in DEFAULT_WIRING.fans),
                   levels=DEFAULT_WIRING.levels)
    r = Rig(tmp_path, wiring=fixed)
    try:
        with r.lab as lab:
            found = det.detect(lab, r.pwms, r.tachs)
        assert found.suspect is not None and "none followed any of the 7 pwm output(s)" in found.suspect
        assert det.report(found)[-1].startswith("nothing stored: ")
        assert as_found(r.before, r.board.knob_values()) and not r.journal.dirty
    finally:
        r.close()


def test_a_pwm_whose_firmware_keeps_control_is_not_called_an_empty_header(tmp_path):
    """The recorded X570 board, whose nct6798 takes pwm2_enable := 1 and reads 5 again (SmartFan kept by the
    firmware), and whose recorded tachometers follow nothing: pwm2 is 'not controlled', left paired by
    number, and the detection as a whole is not to be stored."""
    io = DriverIO()
    io.enable_ignored["pwm2_enable"] = 5
    root = copy_machine(tmp_path, X570)
    backend = HwmonBackend(str(root), io=io)
    devices = backend.discover()
    clock = FakeClock()
    lab = Lab(backend, devices, Journal(tmp_path / "state"), clock=clock, sleep=clock.advance)
    try:
        with lab:
            found = det.detect(lab, det.writable_pwms(devices), det.fan_inputs(devices))
    finally:
        backend.close()
    assert found.refused == {f"{NCT}/pwm2": "pwm2_enable reads 5 after := 1"}
    assert f"{NCT}/pwm2" not in found.followers and f"{NCT}/pwm1" in found.followers
    assert found.suspect is not None  # recorded tachs: fans turn, none follows
    assert (f"{NCT}/pwm2: not controlled: its driver refuses manual mode (pwm2_enable reads 5 after := 1); "
            "left paired by number") in det.report(found)
    setup = found.setup(clock.wall())
    assert f"{NCT}/pwm2" not in setup.pwms
