"""pwm knobs against drivers that round, refuse and report differently (tests/backends/drivers.py), on the
recorded X570 (nct6798) and Dell Precision 7920 (dell_smm) trees: fallbacks, levels, restore to safety."""

from __future__ import annotations

import errno

import pytest

from aithermd.actuate.applier import Applier
from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import restore_journal
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.pwm import DUTY_FIRST, DUTY_ONLY, pct_to_pwm_up
from aithermd.model import Decision, Layer
from tests.support.machines import DELL_7920, X570, copy_machine

from .drivers import DriverIO, dell_smm_level

NCT = "hwmon:nct6798-isa-0290"
DELL = "hwmon:dell_smm-virtual-0"
CHIP = "devices/platform/nct6775.656/hwmon/hwmon1"
DELL_CHIP = "devices/virtual/hwmon/hwmon1"
POLICY = Decision("x", 0.0, Layer.POLICY, "balanced/board-fans")


def _backend(tmp_path, machine):
    root = copy_machine(tmp_path, machine)
    io = DriverIO()
    backend = HwmonBackend(str(root), io=io)
    backend.discover()
    return backend, io, root


@pytest.fixture
def x570(tmp_path):
    backend, io, root = _backend(tmp_path, X570)
    yield backend, io, root / CHIP
    backend.close()


@pytest.fixture
def dell(tmp_path):
    backend, io, root = _backend(tmp_path, DELL_7920)
    io.levels["pwm1"] = io.levels["pwm2"] = io.levels["pwm3"] = dell_smm_level
    yield backend, io, root / DELL_CHIP
    backend.close()


def _apply(applier, backend, knob_id, value, t=1.0, layer=Layer.POLICY):
    knob = _knob(backend, knob_id)
    rule = POLICY.rule if layer == Layer.POLICY else "safety/critical-temperature"
    dec = Decision(knob_id, value, layer, rule)
    return applier.apply(backend, knob, knob.device_id, dec, value, backend.read_knob(knob_id), t)


def _knob(backend, knob_id):
    return next(k for d in backend._devices for k in d.knobs if k.id == knob_id)


def test_duties_round_up_to_the_next_raw_step():
    assert [pct_to_pwm_up(p) for p in (0.0, 8.0, 60.0, 100.0, 0.1)] == [0, 21, 153, 255, 1]


def test_a_quantised_driver_is_written_one_level_up_never_less_cooling(dell, tmp_path):
    """dell_smm keeps 3 fan states: 20 % (51) would read back 0 (the fan stops); the knob writes the next
    level up (128, 50 %), learns the levels, and the applier sees neither drift nor a reason to rewrite."""
    backend, io, chip = dell
    applier = Applier(Journal(tmp_path / "state"))
    after, events = _apply(applier, backend, f"{DELL}/pwm2", 20.0)
    assert (chip / "pwm2").read_text() == "128\n"
    assert after.value == pytest.approx(50.2, abs=0.1)
    assert [e.kind for e in events] == ["actuation"]
    assert backend.pwm_knob(f"{DELL}/pwm2").settles_at(20.0) == pytest.approx(50.2, abs=0.1)
    io.writes.clear()
    _, events = _apply(applier, backend, f"{DELL}/pwm2", 21.0, t=2.0)
    assert events == [] and io.writes == []  # the level it holds already gives 21 %
    _, events = _apply(applier, backend, f"{DELL}/pwm2", 70.0, t=3.0)
    assert (chip / "pwm2").read_text() == "255\n" and [e.kind for e in events] == ["actuation"]
    assert applier.observe(_knob(backend, f"{DELL}/pwm2"), backend.read_knob(f"{DELL}/pwm2"), 4.0, 4.0) == []


def test_it87_full_speed_read_back_is_the_same_setting(x570, tmp_path):
    """it87 reports pwmN_enable 0 for a manual fan at 255: not drift, and no rewrite every tick."""
    backend, io, chip = x570
    io.full_reads_zero.add("pwm2_enable")
    applier = Applier(Journal(tmp_path / "state"))
    after, events = _apply(applier, backend, f"{NCT}/pwm2", 100.0)
    assert (chip / "pwm2_enable").read_text() == "0\n"
    assert (after.value, after.mode) == (100.0, "manual")
    assert [e.kind for e in events] == ["actuation"]
    _, events = _apply(applier, backend, f"{NCT}/pwm2", 100.0, t=2.0)
    assert events == []
    assert applier.observe(_knob(backend, f"{NCT}/pwm2"), backend.read_knob(f"{NCT}/pwm2"), 3.0, 3.0) == []


def test_a_driver_taking_manual_mode_only_after_a_duty_gets_duty_then_mode(x570):
    backend, io, chip = x570
    io.enable_after_duty.add("pwm3_enable")
    backend.write_knob(f"{NCT}/pwm3", 40.0)
    assert [(p.rsplit("/", 1)[1], d) for p, d in io.writes] == [
        ("pwm3", b"102\n"), ("pwm3_enable", b"1\n"), ("pwm3", b"102\n")]
    assert backend._pwms[f"{NCT}/pwm3"].order == DUTY_FIRST
    kv = backend.read_knob(f"{NCT}/pwm3")
    assert kv.mode == "manual" and kv.value == pytest.approx(40.0)


def test_a_mode_write_the_firmware_ignores_falls_back_to_the_duty_alone(x570):
    """pwmN_enable := 1 accepted but reading 5 again (firmware kept control): duty first, then duty only."""
    backend, io, chip = x570
    io.enable_ignored["pwm1_enable"] = 5
    backend.write_knob(f"{NCT}/pwm1", 70.0)
    assert backend._pwms[f"{NCT}/pwm1"].order == DUTY_ONLY
    assert (chip / "pwm1").read_text() == "179\n"
    assert "pwm1_enable reads 5" in backend._pwms[f"{NCT}/pwm1"].refusal


def test_a_refused_mode_is_said_once_and_the_duty_read_back_in_the_drivers_mode_is_no_drift(x570, tmp_path):
    """thinkpad_acpi-like: pwmN_enable := 1 answers EINVAL every time; the duty alone is written, the
    refusal is one event, and the duty read back (mode auto) is the setting: no 'did not stick' per tick."""
    backend, io, chip = x570
    io.write_faults["pwm2_enable"] = OSError(errno.EINVAL, "Invalid argument")
    applier = Applier(Journal(tmp_path / "state"))
    pwm2 = f"{NCT}/pwm2"
    after, events = _apply(applier, backend, pwm2, 40.0)
    assert [(e.kind, e.data.get("why")) for e in events] == [("actuation", None), ("drift", "mode_refused")]
    assert "refuses manual mode (EINVAL on pwm2_enable := 1)" in events[1].message
    assert (after.value, after.mode) == (pytest.approx(40.0, abs=0.4), "auto")
    assert (chip / "pwm2").read_text() == "102\n" and (chip / "pwm2_enable").read_text() == "5\n"
    for t, duty in ((2.0, 45.0), (3.0, 50.0)):  # the curve moves on: each duty written, nothing else said
        _, events = _apply(applier, backend, pwm2, duty, t=t)
        assert [e.kind for e in events] == ["actuation"]
    _, events = _apply(applier, backend, pwm2, 50.0, t=4.0)
    assert events == []  # in place: no rewrite
    assert applier.observe(_knob(backend, pwm2), backend.read_knob(pwm2), 5.0, 5.0) == []


def test_a_fan_whose_mode_and_duty_are_both_refused_raises_the_alarm(x570, tmp_path):
    """amdgpu-like: the duty only in manual mode, and the mode write refused: uncontrollable, said so."""
    backend, io, chip = x570
    io.manual_only.add("pwm4")
    io.write_faults["pwm4_enable"] = OSError(errno.EINVAL, "Invalid argument")
    applier = Applier(Journal(tmp_path / "state"))
    _, events = _apply(applier, backend, f"{NCT}/pwm4", 60.0)
    assert applier.alarms[f"{NCT}/pwm4"].kind == "uncontrollable"
    assert "cannot be controlled" in applier.alarms[f"{NCT}/pwm4"].message
    assert [e.kind for e in events] == ["fault"] and "Uncontrollable" in events[0].message
    del io.write_faults["pwm4_enable"]  # the driver takes it again (a reload of the module)
    _apply(applier, backend, f"{NCT}/pwm4", 60.0, t=2.0)
    assert f"{NCT}/pwm4" not in applier.alarms
    assert (chip / "pwm4").read_text() == "153\n"


def test_a_failed_restore_leaves_the_fan_at_full_duty_and_says_so(x570, tmp_path):
    """The original (SmartFan IV, enable 5) cannot be put back: the fan is not left in manual at 20 %."""
    backend, io, chip = x570
    journal = Journal(tmp_path / "state")
    applier = Applier(journal)
    _apply(applier, backend, f"{NCT}/pwm2", 20.0)
    assert (chip / "pwm2").read_text() == "51\n" and (chip / "pwm2_enable").read_text() == "1\n"
    io.write_faults["pwm2_enable"] = OSError(errno.EINVAL, "Invalid argument")
    report = restore_journal(journal, backends=[backend])
    assert report.ok and report.restored == (f"{NCT}/pwm2",)
    assert (chip / "pwm2").read_text() == "255\n"
    note = report.fallbacks[f"{NCT}/pwm2"]
    assert "restoring the original failed" in note and "full duty" in note
    assert not journal.dirty


def test_a_restore_that_cannot_even_reach_full_duty_fails_and_stays_journaled(x570, tmp_path):
    backend, io, chip = x570
    journal = Journal(tmp_path / "state")
    _apply(Applier(journal), backend, f"{NCT}/pwm2", 20.0)
    io.write_faults["pwm2"] = OSError(errno.EIO, "Input/output error")
    io.write_faults["pwm2_enable"] = OSError(errno.EIO, "Input/output error")
    report = restore_journal(journal, backends=[backend])
    assert not report.ok and "full duty failed too" in report.failed[f"{NCT}/pwm2"]
    assert f"{NCT}/pwm2" in journal


def _write_only_enable(chip):
    """dell_smm on a machine of its fan-control whitelist has pwm1_enable, mode 0200 (write-only): kernfs
    refuses every read of it with EACCES, root included."""
    (chip / "pwm1_enable").write_text("2\n")
    (chip / "pwm1_enable").chmod(0o200)


def test_an_unreadable_pwm_enable_does_not_stop_control_and_restore_goes_to_auto(tmp_path):
    root = copy_machine(tmp_path, DELL_7920)
    chip = root / DELL_CHIP
    _write_only_enable(chip)
    io = DriverIO()
    io.faults["pwm1_enable"] = [OSError(errno.EACCES, "Permission denied")]
    backend = HwmonBackend(str(root), io=io)
    backend.discover()
    journal = Journal(tmp_path / "state")
    applier = Applier(journal)
    after, events = _apply(applier, backend, f"{DELL}/pwm1", 100.0)
    assert [e.kind for e in events] == ["actuation"]
    assert (chip / "pwm1").read_text() == "255\n" and (chip / "pwm1_enable").read_text() == "1\n"
    assert after.value == 100.0 and after.mode is None
    saved = journal.entries()[f"{DELL}/pwm1"].saved
    assert saved == {"pwm": 0, "enable": None, "enable_unreadable": "EACCES", "auto": 2}
    report = restore_journal(journal, backends=[backend])
    assert (chip / "pwm1_enable").read_text() == "2\n"  # BIOS control again
    assert "handed to the driver's automatic mode (enable 2)" in report.fallbacks[f"{DELL}/pwm1"]
    backend.close()


def test_an_unreadable_pwm_enable_of_an_unknown_driver_restores_full_duty(tmp_path):
    root = copy_machine(tmp_path, DELL_7920)
    chip = root / DELL_CHIP
    _write_only_enable(chip)
    (chip / "name").write_text("acme_ec\n")
    io = DriverIO()
    io.faults["pwm1_enable"] = [OSError(errno.EACCES, "Permission denied")]
    backend = HwmonBackend(str(root), io=io)
    (dev,) = [d for d in backend.discover() if d.name == "acme_ec"]
    knob_id = f"{dev.id}/pwm1"
    journal = Journal(tmp_path / "state")
    _apply(Applier(journal), backend, knob_id, 30.0)
    assert journal.entries()[knob_id].saved["auto"] is None
    report = restore_journal(journal, backends=[backend])
    assert (chip / "pwm1").read_text() == "255\n"
    assert "no automatic mode is known for acme_ec" in report.fallbacks[knob_id]
    backend.close()


def test_a_duty_refused_after_the_mode_took_leaves_the_fan_in_its_own_mode_and_journaled(x570, tmp_path):
    """An EC-owned header: pwm4_enable := 1 is taken, pwm4 answers EPERM. The fan was left in manual mode
    at its old duty and the journal entry dropped (nothing restored it at exit). Now it goes back to
    SmartFan IV at once, the alarm says why, and the journal keeps the original."""
    backend, io, chip = x570
    journal = Journal(tmp_path / "state")
    applier = Applier(journal)
    io.write_faults["pwm4"] = OSError(errno.EPERM, "Operation not permitted")
    _, events = _apply(applier, backend, f"{NCT}/pwm4", 40.0)
    assert (chip / "pwm4_enable").read_text() == "5\n"
    assert applier.alarms[f"{NCT}/pwm4"].kind == "uncontrollable"
    assert [e.kind for e in events] == ["fault"] and "handed back to the driver's own control" in events[0].message
    assert f"{NCT}/pwm4" in journal
    _, again = _apply(applier, backend, f"{NCT}/pwm4", 45.0, t=2.0)  # the curve moves: the same fault, not said
    assert again == [] and (chip / "pwm4_enable").read_text() == "5\n"
    report = restore_journal(journal, backends=[backend])
    assert report.ok and report.fallbacks == {} and (chip / "pwm4_enable").read_text() == "5\n"


def test_a_duty_busy_for_good_in_manual_mode_is_handed_back_after_three_tries(x570, tmp_path):
    """EBUSY on every duty write (an SMBus held by a BMC): two ticks are tried again in manual mode, the
    third hands the fan back to its automatic mode rather than leave it at a duty nobody can change."""
    backend, io, chip = x570
    applier = Applier(Journal(tmp_path / "state"))
    io.write_faults["pwm3"] = OSError(errno.EBUSY, "Device or resource busy")
    for t in (1.0, 2.0):
        _apply(applier, backend, f"{NCT}/pwm3", 50.0 + t, t=t)
        assert (chip / "pwm3_enable").read_text() == "1\n" and f"{NCT}/pwm3" not in applier.alarms
    _apply(applier, backend, f"{NCT}/pwm3", 53.0, t=3.0)
    assert (chip / "pwm3_enable").read_text() == "5\n"
    assert "(EBUSY)" in applier.alarms[f"{NCT}/pwm3"].message
    del io.write_faults["pwm3"]  # the bus is free again: control comes back, the alarm goes
    _apply(applier, backend, f"{NCT}/pwm3", 54.0, t=4.0)
    assert (chip / "pwm3_enable").read_text() == "1\n" and (chip / "pwm3").read_text() == "138\n"
    assert f"{NCT}/pwm3" not in applier.alarms


def test_full_duty_asked_of_a_fan_whose_duty_is_refused_gets_full_speed_by_its_mode(x570, tmp_path):
    """A safety decision (fans to full) on a fan whose duty write is refused: nct6775's pwmN_enable 0 is
    full speed, which is what was asked; it holds (read back as 100 %: no rewrite every tick), and a later
    lower duty still hands the fan back to its automatic mode."""
    backend, io, chip = x570
    applier = Applier(Journal(tmp_path / "state"))
    io.write_faults["pwm2"] = OSError(errno.EPERM, "Operation not permitted")
    after, events = _apply(applier, backend, f"{NCT}/pwm2", 100.0, layer=Layer.SAFETY)
    assert (chip / "pwm2_enable").read_text() == "0\n"
    assert (after.value, after.mode) == (100.0, "manual") and [e.kind for e in events] == ["actuation"]
    io.writes.clear()
    _, events = _apply(applier, backend, f"{NCT}/pwm2", 100.0, t=2.0, layer=Layer.SAFETY)
    assert events == [] and io.writes == []
    _apply(applier, backend, f"{NCT}/pwm2", 30.0, t=3.0)
    assert (chip / "pwm2_enable").read_text() == "5\n" and applier.alarms[f"{NCT}/pwm2"].kind == "uncontrollable"


def test_a_pwm_that_reads_back_0_whatever_is_written_is_trusted_as_written(x570, tmp_path):
    """An EC answering 0 to every read of pwm3: each write looked quantised to nothing, so the knob climbed
    to 255 at every write (3 writes a tick, the fan flat out) while status said the curve's duty. After a
    few ticks the read-back is known to mean nothing: one write per change, the duty reported is the one
    written, said once."""
    from structlog.testing import capture_logs

    backend, io, chip = x570
    io.faults["hwmon1/pwm3"] = [b"0\n"]
    applier = Applier(Journal(tmp_path / "state"))
    per_tick = []
    with capture_logs() as logs:
        for t, duty in enumerate((50.0, 45.0, 40.0, 35.0, 30.0, 35.0, 40.0, 45.0), start=1):
            io.writes.clear()
            after, _ = _apply(applier, backend, f"{NCT}/pwm3", duty, t=float(t))
            per_tick.append([int(d) for p, d in io.writes if p.endswith("/pwm3")])
    assert per_tick[0] == [128, 255]  # the round-up at first: 128 read back as 0
    assert per_tick[-3:] == [[pct_to_pwm_up(d)] for d in (35.0, 40.0, 45.0)]  # then one write each
    assert (chip / "pwm3").read_text() == "115\n"
    assert after.value == pytest.approx(45.1, abs=0.1)  # what was written, not the 0 read back
    assert backend.read_knob(f"{NCT}/pwm3").value == pytest.approx(45.1, abs=0.1)
    warned = [e for e in logs if e["event"] == "pwm_readback_ignored"]
    assert len(warned) == 1 and warned[0]["knob"] == f"{NCT}/pwm3"
    assert "pwm reads back 0 whatever is written" in warned[0]["message"]


def test_a_quantised_driver_is_never_taken_for_a_meaningless_read_back(dell, tmp_path):
    """dell_smm holds 64-190 as one level: a curve moving inside it reads the same back for many writes,
    but never across 128 raw, and its 255 reads 255."""
    backend, _, _ = dell
    applier = Applier(Journal(tmp_path / "state"))
    duties = [26.0 + (i % 24) * 2.0 for i in range(60)] + [100.0, 30.0, 70.0, 10.0] * 5
    for t, duty in enumerate(duties, start=1):
        _apply(applier, backend, f"{DELL}/pwm2", duty, t=float(t))
    knob = backend.pwm_knob(f"{DELL}/pwm2")
    assert not knob.levels.blind and knob.levels.quantised
    assert knob.settles_at(30.0) == pytest.approx(50.2, abs=0.1)  # its levels still known


def test_a_fan_found_manual_behind_a_meaningless_read_back_is_never_restored_stopped(x570, tmp_path):
    """Found in manual mode at 93 (fancontrol, a BIOS) behind the EC that answers 0 to every read: the
    original was journaled as 0, and the exit restore wrote pwm 0 in manual mode: the fan stopped for good.
    Once the read-back is known to mean nothing, the fan goes to the driver's automatic mode instead."""
    backend, io, chip = x570
    (chip / "pwm3_enable").write_text("1\n")
    (chip / "pwm3").write_text("93\n")
    io.faults["hwmon1/pwm3"] = [b"0\n"]
    journal = Journal(tmp_path / "state")
    applier = Applier(journal)
    for t, duty in enumerate((50.0, 45.0, 40.0, 35.0, 30.0, 35.0, 40.0), start=1):
        _apply(applier, backend, f"{NCT}/pwm3", duty, t=float(t))
    assert backend.pwm_knob(f"{NCT}/pwm3").levels.blind
    assert journal.entries()[f"{NCT}/pwm3"].saved == {"pwm": 0, "enable": 1}  # what the read said
    report = restore_journal(journal, backends=[backend])
    assert report.ok and f"{NCT}/pwm3" in report.restored
    assert (chip / "pwm3_enable").read_text() == "5\n"  # SmartFan: the chip cools it again
    assert "the original duty is unknown" in report.fallbacks[f"{NCT}/pwm3"]


def test_a_read_back_that_moves_again_is_believed_again_and_a_full_speed_one_is_never_blind(x570):
    """A constant read-back that later moves (an EC busy for a while) stayed ignored for good, and a
    two-speed fan reading full at any duty was reported at the duty written while it ran at 100 %."""
    from aithermd.backends.pwm_levels import Levels

    backend, io, chip = x570
    applier = Applier(Journal(chip.parent / "state"))
    io.faults["hwmon1/pwm3"] = [b"0\n"]
    for t, duty in enumerate((50.0, 45.0, 40.0, 35.0, 30.0, 35.0), start=1):
        _apply(applier, backend, f"{NCT}/pwm3", duty, t=float(t))
    knob = backend.pwm_knob(f"{NCT}/pwm3")
    assert knob.levels.blind and backend.read_knob(f"{NCT}/pwm3").value == pytest.approx(35.3, abs=0.1)
    del io.faults["hwmon1/pwm3"]  # the file reads true again: 35 % as written
    assert backend.read_knob(f"{NCT}/pwm3").value == pytest.approx(35.3, abs=0.1)
    assert not knob.levels.blind
    full = Levels()
    for written in [20, 60, 100, 140, 180, 220, 30, 70, 110, 150, 190, 230] * 2:
        full.learn(written, 255)
    assert not full.blind  # at or above every write: the fan gets at least what was asked


def test_a_read_back_that_trails_the_write_is_lag_not_a_level(x570, tmp_path):
    """pwm3 reads the fan's output, moving toward the write at 5 raw/s (attack3 N6): the round-up took each
    lagging read for a level, wrote up to 10 values a tick, learnt levels that made later writes start
    high (228 for a ~55 % request) and drove the fan toward 255 while the curve asked 45-60 %. After the
    first sample shows the read-back moving toward the write, one write per change, levels only from a
    read-back that stayed put, no drift reported while it settles."""
    backend, io, chip = x570
    (chip / "pwm3").write_text("60\n")
    io.ramp["pwm3"] = 5.0
    applier = Applier(Journal(tmp_path / "state"))
    knob_id = f"{NCT}/pwm3"
    knob, per_tick, drift = _knob(backend, knob_id), [], []
    for t, duty in enumerate([45.0, 47.0, 50.0, 52.0, 55.0, 57.0, 60.0, 58.0, 55.0, 52.0] * 2, start=1):
        io.writes.clear()
        io.advance(1.0)
        kv = backend.read_knob(knob_id)  # the tick's one sample, as the daemon takes it
        drift += [e for e in applier.observe(knob, kv, t, t) if e.kind == "drift"]
        dec = Decision(knob_id, duty, Layer.POLICY, POLICY.rule)
        _, events = applier.apply(backend, knob, knob.device_id, dec, duty, kv, t)
        drift += [e for e in events if e.kind == "drift"]
        per_tick.append([int(d) for p, d in io.writes if p.endswith("/pwm3")])
    levels = backend.pwm_knob(knob_id).levels
    assert levels.lagging and not levels.blind
    assert len(per_tick[0]) > 1  # the first tick cannot tell lag from a level yet
    assert all(len(w) <= 1 for w in per_tick[1:]), per_tick
    assert max(max(w, default=0) for w in per_tick[1:]) <= pct_to_pwm_up(60.0)  # never above the curve
    assert drift == []
    assert backend.pwm_knob(knob_id).settles_at(52.0) == pytest.approx(52.2, abs=0.2)  # no level learnt


def test_a_lagging_read_back_that_rests_below_the_write_is_learnt_as_a_level():
    """A lagging knob still gets at least the duty asked: a read-back that stays put below the write from
    one sample to the next is a level, and the next write goes one level up."""
    from aithermd.backends.pwm_levels import Levels

    lv = Levels()
    lv.wrote(100, 80)
    assert not lv.settle(90) and lv.lagging  # moved toward 100 with nothing written: lag
    lv.written = 128
    lv.wrote(128, None)
    assert not lv.settle(100) and not lv.quantised  # the first sample after a write: still moving
    assert not lv.settle(120)
    assert not lv.settle(120) and lv.quantised and lv.seen == {128: 120}  # stayed put: a level
    assert lv.write_for(128) == 136  # the next write goes up by what was missing
    lv.written = 60
    lv.wrote(60, None)
    for raw in (70, 65, 60, 60, 60):  # resting where written
        lv.settle(raw)
    assert lv.seen[60] == 60 and not lv.blind
