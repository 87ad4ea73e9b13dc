"""pwmN knobs: manual mode before the duty, save/restore of raw pwm and pwmN_enable, constraints, errors."""

from __future__ import annotations

import errno
import os

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.pwm import Uncontrollable, pwm_mode
from aithermd.errors import DeviceLost, OutOfRange, UnknownKnob
from tests.support.machines import copy_machine

from .faults import FaultIO

NCT = "hwmon:nct6798-isa-0290"
DELL = "hwmon:dell_smm-virtual-0"


@pytest.fixture
def x570(tmp_path):
    root = copy_machine(tmp_path, "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp")
    io = FaultIO()
    backend = HwmonBackend(str(root), io=io)
    backend.discover()
    yield backend, io, root / "devices" / "platform" / "nct6775.656" / "hwmon" / "hwmon1"
    backend.close()


def test_knob_description(x570):
    backend, _, _ = x570
    (nct,) = [d for d in backend.discover() if d.id == NCT]
    pwm2 = nct.knobs[1]
    assert (pwm2.id, pwm2.kind, pwm2.unit, pwm2.min, pwm2.max) == (f"{NCT}/pwm2", "pwm", "%", 0.0, 100.0)
    assert pwm2.fan_channel == f"{NCT}/fan2" and pwm2.writable and pwm2.why_not is None


def test_write_switches_to_manual_before_the_duty(x570):
    backend, io, chip = x570
    backend.write_knob(f"{NCT}/pwm2", 60.0)
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm2_enable", b"1\n"), ("pwm2", b"153\n")]
    assert (chip / "pwm2").read_text() == "153\n" and (chip / "pwm2_enable").read_text() == "1\n"
    value = backend.read_knob(f"{NCT}/pwm2")
    assert value.mode == "manual" and value.value == pytest.approx(60.0)
    io.writes.clear()
    backend.write_knob(f"{NCT}/pwm2", 100.0)  # already manual: only the duty
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm2", b"255\n")]


def test_save_and_restore_automatic_mode(x570):
    backend, io, chip = x570
    saved = backend.save_knob(f"{NCT}/pwm2")
    assert saved == {"pwm": 88, "enable": 5}
    backend.write_knob(f"{NCT}/pwm2", 0.0)
    io.writes.clear()
    backend.restore_knob(f"{NCT}/pwm2", saved)
    # the mode first (the safe state), the duty, the mode again; nothing read in between (restore8)
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm2_enable", b"5\n"), ("pwm2", b"88\n"),
                                                                 ("pwm2_enable", b"5\n")]
    assert backend.read_knob(f"{NCT}/pwm2").mode == "auto"


def test_save_and_restore_manual_mode(x570):
    backend, io, chip = x570
    (chip / "pwm3_enable").write_text("1\n")
    (chip / "pwm3").write_text("160\n")
    saved = backend.save_knob(f"{NCT}/pwm3")
    assert saved == {"pwm": 160, "enable": 1}
    backend.write_knob(f"{NCT}/pwm3", 100.0)
    io.writes.clear()
    assert backend.restore_knob(f"{NCT}/pwm3", saved) is None
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm3_enable", b"1\n"), ("pwm3", b"160\n")]


@pytest.mark.parametrize("to_writer", [False, True])
def test_a_fan_found_manual_at_a_low_duty_goes_to_the_drivers_automatic_mode_unless_its_writer_takes_it(
        x570, to_writer):
    """Found in manual mode at 44 % (what the daemon finds when the true original was lost: a journal moved
    aside, a driver reload, a chip back under another name; attack6 G1/G5/G9): put back there, the fan would
    run at 44 % with nothing driving it. Handed back to the program that keeps writing it, it is as found."""
    backend, io, chip = x570
    (chip / "pwm3_enable").write_text("1\n")
    saved = backend.save_knob(f"{NCT}/pwm3")
    assert saved == {"pwm": 112, "enable": 1}
    backend.write_knob(f"{NCT}/pwm3", 100.0)
    io.writes.clear()
    note = backend.restore_knob(f"{NCT}/pwm3", {**saved, "to_writer": True} if to_writer else saved)
    writes = [(p.rsplit("/", 1)[1], d) for p, d in io.writes]
    if to_writer:
        assert note is None and writes == [("pwm3_enable", b"1\n"), ("pwm3", b"112\n")]
    else:
        assert writes == [("pwm3_enable", b"5\n")] and (chip / "pwm3_enable").read_text() == "5\n"
        assert "found in manual mode at 44 %" in note and "automatic mode (enable 5)" in note


@pytest.mark.parametrize("saved", [{"pwm": "abc", "enable": 1}, {"pwm": 300, "enable": 1},
                                   {"pwm": 200, "enable": "manual"}, {"pwm": 2.5, "enable": 1}, [1]])
def test_a_saved_state_that_does_not_decode_goes_to_the_drivers_automatic_mode(x570, saved):
    """attack6 G2: ``"pwm": "abc"`` raised ValueError past the full-duty fallback; the fan stayed manual at a
    low duty."""
    backend, io, chip = x570
    backend.write_knob(f"{NCT}/pwm3", 16.0)
    note = backend.restore_knob(f"{NCT}/pwm3", saved)
    assert (chip / "pwm3_enable").read_text() == "5\n" and "handed to the driver's automatic mode" in note


def test_a_restore_write_busy_for_a_moment_is_tried_again(x570):
    """attack6 G7: one EAGAIN on pwmN_enable during the exit restore left the fan at full duty, and its true
    original was forgotten for good."""
    backend, io, chip = x570
    saved = backend.save_knob(f"{NCT}/pwm2")
    assert saved == {"pwm": 88, "enable": 5}
    backend.write_knob(f"{NCT}/pwm2", 30.0)
    io.write_faults["pwm2_enable"] = [OSError(errno.EAGAIN, "busy"), OSError(errno.EBUSY, "busy")]
    assert backend.restore_knob(f"{NCT}/pwm2", saved) is None
    assert (chip / "pwm2_enable").read_text() == "5\n"
    backend.write_knob(f"{NCT}/pwm2", 30.0)
    io.write_faults["pwm2_enable"] = [OSError(errno.EAGAIN, "busy")] * 6  # busy every try of both: full duty
    note = backend.restore_knob(f"{NCT}/pwm2", saved)
    assert "full duty" in note and (chip / "pwm2").read_text() == "255\n"


def test_driver_without_pwm_enable(tmp_path):
    root = copy_machine(tmp_path, "dell-precision-7920-tower-xeon-coretemp-dell-smm-fans-nouveau")
    io = FaultIO()
    backend = HwmonBackend(str(root), io=io)
    backend.discover()
    assert backend.read_knob(f"{DELL}/pwm2").mode is None
    saved = backend.save_knob(f"{DELL}/pwm2")
    assert saved == {"pwm": 99, "enable": None}
    backend.write_knob(f"{DELL}/pwm2", 100.0)
    backend.restore_knob(f"{DELL}/pwm2", saved)
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm2", b"255\n"), ("pwm2", b"99\n")]
    backend.close()


@pytest.mark.parametrize("value", [-0.1, 100.5, float("nan")])
def test_duty_outside_0_100_is_refused(x570, value):
    backend, io, _ = x570
    with pytest.raises(OutOfRange):
        backend.write_knob(f"{NCT}/pwm1", value)
    assert io.writes == []


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EINVAL])
def test_a_duty_refused_in_manual_mode_hands_the_fan_back_to_its_automatic_mode(x570, code):
    """The mode write takes, the duty is refused (an EC-owned header): the fan is not left in manual mode at
    its old duty; it goes back to SmartFan IV (enable 5, as found) and the knob is uncontrollable."""
    backend, io, chip = x570
    io.write_faults["pwm1"] = OSError(code, "x")
    with pytest.raises(Uncontrollable) as raised:
        backend.write_knob(f"{NCT}/pwm1", 50.0)
    assert str(raised.value) == (
        f"{NCT}/pwm1: the driver takes manual mode but refuses the duty ({errno.errorcode[code]}): pwm1 handed "
        "back to the driver's own control (pwm1_enable 5)")
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm1_enable", b"1\n"), ("pwm1_enable", b"5\n")]
    assert (chip / "pwm1_enable").read_text() == "5\n"


def test_a_lost_device_is_lost_not_refused(x570):
    backend, io, _ = x570
    io.write_faults["pwm1"] = io.write_faults["pwm1_enable"] = OSError(errno.ENODEV, "x")
    with pytest.raises(DeviceLost):
        backend.write_knob(f"{NCT}/pwm1", 50.0)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP])
def test_a_driver_refusing_manual_mode_still_gets_the_duty(x570, code):
    backend, io, chip = x570
    io.write_faults["pwm1_enable"] = OSError(code, "x")
    backend.write_knob(f"{NCT}/pwm1", 60.0)
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [("pwm1", b"153\n")]
    value = backend.read_knob(f"{NCT}/pwm1")  # the read-back shows the mode it kept: the applier's drift
    assert value.value == pytest.approx(60.0) and value.mode == "auto"  # pwm1_enable stays 5 (SmartFan IV)
    assert (chip / "pwm1_enable").read_text() == "5\n"


def test_unknown_knob(x570):
    backend, _, _ = x570
    for call in (backend.read_knob, backend.save_knob):
        with pytest.raises(UnknownKnob):
            call(f"{NCT}/pwm9")


def test_read_only_pwm_says_why(tmp_path):
    class ReadOnly(FaultIO):
        def writable(self, path: str) -> bool:
            return not path.endswith("_enable")

    root = copy_machine(tmp_path, "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp")
    backend = HwmonBackend(str(root), io=ReadOnly())
    knob = next(d for d in backend.discover() if d.id == NCT).knobs[0]
    why = "needs root" if os.geteuid() else "permission denied to root (the file's mode, or a security " \
        "module)"
    assert knob.writable is False and knob.why_not == f"pwm1_enable not writable ({why})"
    backend.close()


def test_a_read_only_sysfs_mount_is_named_not_root(tmp_path, monkeypatch):
    """/sys mounted read-only (a container; ProtectKernelTunables= without ReadWritePaths=): the knob says so,
    not "needs root", and so does a write refused with EROFS."""
    import errno

    from aithermd.backends import sysfs
    from aithermd.errors import NoPermission

    root = copy_machine(tmp_path, "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp")
    real = os.statvfs

    class ReadOnlyMount(FaultIO):
        def writable(self, path: str) -> bool:
            return False

    monkeypatch.setattr(sysfs.os, "statvfs", lambda p: os.statvfs_result(
        (*real(p)[:8], real(p).f_flag | os.ST_RDONLY, real(p)[9])))
    backend = HwmonBackend(str(root), io=ReadOnlyMount())
    knob = next(d for d in backend.discover() if d.id == NCT).knobs[0]
    assert knob.why_not.startswith("pwm1 not writable (read-only file system: sysfs is mounted read-only")
    assert "needs root" not in knob.why_not
    backend.close()
    err = sysfs.write_error(OSError(errno.EROFS, "Read-only file system"), "pwm1")
    assert isinstance(err, NoPermission) and "read-only" in str(err) and "needs root" not in str(err)


def test_pwm_modes():
    assert [pwm_mode(v) for v in (None, 0, 1, 2, 5)] == [None, "full", "manual", "auto", "auto"]


def test_fast_constructors_build_the_same_objects():
    from aithermd.backends.fast import ok_knob as _ok_knob
    from aithermd.backends.fast import ok_reading as _ok_reading
    from aithermd.model import KnobValue, Reading

    assert _ok_reading("a/temp1", 33.0) == Reading("a/temp1", 33.0)
    assert repr(_ok_reading("a/temp1", 33.0)) == repr(Reading("a/temp1", 33.0))
    assert _ok_knob("a/pwm1", 40.0, "auto") == KnobValue("a/pwm1", 40.0, "auto")


def test_enodev_once_during_a_restore_leaves_the_fan_at_full_duty_not_at_the_duty_written_first(x570):
    """attack7 H3: ENODEV on pwmN_enable raised DeviceLost past the full-duty fallback, and the fan stayed
    manual at the duty written before the mode. The mode now goes first and again after the duty: one ENODEV
    is written over; ENODEV on both leaves the fan at full duty."""
    backend, io, chip = x570
    saved = backend.save_knob(f"{NCT}/pwm2")
    assert saved == {"pwm": 88, "enable": 5}
    backend.write_knob(f"{NCT}/pwm2", 30.0)
    io.write_faults["pwm2_enable"] = [OSError(errno.ENODEV, "no such device")]
    assert backend.restore_knob(f"{NCT}/pwm2", saved) is None
    assert ((chip / "pwm2").read_text(), (chip / "pwm2_enable").read_text()) == ("88\n", "5\n")
    backend.write_knob(f"{NCT}/pwm2", 30.0)
    io.write_faults["pwm2_enable"] = [OSError(errno.ENODEV, "no such device")] * 2
    note = backend.restore_knob(f"{NCT}/pwm2", saved)
    assert "full duty" in note and (chip / "pwm2").read_text() == "255\n"
    assert (chip / "pwm2_enable").read_text() == "1\n"
