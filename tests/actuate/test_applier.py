"""Safe actuation: journal before write, read-back, drift, step-back, no-ops, dry-run, faults."""

from __future__ import annotations

import pytest

from aithermd.actuate.applier import Applier
from aithermd.actuate.journal import Journal
from aithermd.errors import NoPermission
from aithermd.model import Decision, Knob, Layer
from tests.support.fake_backend import FakeBackend

DEC = Decision("x", 60.0, Layer.POLICY, "balanced/cpu-fans")


@pytest.fixture
def setup(tmp_path):
    b = FakeBackend(start_pwm=100, start_enable=2)
    j = Journal(tmp_path)
    knob = b.discover()[0].knobs[0]
    return b, j, Applier(j), knob


def current(b, knob):
    return b.read_knob(knob.id)


def test_the_original_is_on_disk_before_the_first_write(setup, tmp_path):
    b, j, applier, knob = setup
    seen = []
    b.on_write = lambda kid, v: seen.append(kid in Journal(tmp_path))
    after, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    assert seen == [True]
    assert j.entries()[knob.id].saved == {"pwm": 100, "enable": 2}
    assert after.mode == "manual" and after.value == pytest.approx(60.0, abs=0.3)
    assert [e.kind for e in events] == ["actuation"]
    assert events[0].data["old"] == pytest.approx(39.2, abs=0.1) and events[0].data["new"] == 60.0
    assert events[0].data["rule"] == "balanced/cpu-fans"


def test_a_second_write_keeps_the_first_original(setup):
    b, j, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    applier.apply(b, knob, b.device_id, DEC, 80.0, current(b, knob), 2.0)
    assert j.entries()[knob.id].saved == {"pwm": 100, "enable": 2}
    assert b.writes == [(knob.id, 60.0), (knob.id, 80.0)]


def test_no_op_is_dropped(setup):
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.2, current(b, knob), 2.0)
    assert events == [] and len(b.writes) == 1


def test_same_value_in_auto_mode_is_still_written(setup):
    b, _, applier, knob = setup
    b.pwm["pwm1"] = 153  # 60 % but automatic
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    assert b.writes == [(knob.id, 60.0)] and b.enable["pwm1"] == 1


def test_a_value_that_does_not_stick_is_drift_reported_once(setup):
    b, _, applier, knob = setup
    b.stuck["pwm1"] = 255  # a BMC holds the fan at full
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    drift = [e for e in events if e.kind == "drift"]
    assert len(drift) == 1 and drift[0].subject == knob.id
    assert "did not stick" in drift[0].message and drift[0].data["got"] == 100.0
    _, again = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 2.0)
    assert again == [] and len(b.writes) == 1  # asked already, reported already: no fight


def test_changes_behind_our_back_are_drift_then_step_back(setup):
    b, j, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    b.rewriter["pwm1"] = 200  # fancontrol rewrites it every cycle
    kinds = []
    for tick in range(5):
        sample = b.sample()
        events = applier.observe(knob, sample.knobs[knob.id], 10.0 + tick, 100.0 + tick)
        kinds.append([e.kind for e in events])
        applier.apply(b, knob, b.device_id, DEC, 60.0, sample.knobs[knob.id], 100.0 + tick)
    assert kinds[0] == ["drift"] and kinds[1] == ["drift"]
    assert kinds[2] == ["drift", "conflict"]
    assert kinds[3] == [] and kinds[4] == []
    assert knob.id in applier.stepped_back
    assert len(b.writes) == 3  # the first write and two attempts; none after stepping back
    # the fan is handed back to its original (automatic mode) at once, not left manual at the last duty
    assert knob.id not in j and b.restored == [(knob.id, {"pwm": 100, "enable": 2, "to_writer": True})]


def test_a_knob_stepped_back_from_is_taken_again_later_and_for_longer_each_time(setup):
    """A burst of changes (three, then the other program is gone) cost the fan its curve until the daemon
    restarted. Now it is taken again after 10 min; a program still there makes it step back for 20."""
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)

    def ticks(start, n):
        out = []
        for tick in range(n):
            sample = b.sample()
            out += applier.observe(knob, sample.knobs[knob.id], start + tick, 1000.0 + start + tick)
            applier.apply(b, knob, b.device_id, DEC, 60.0, sample.knobs[knob.id], 1000.0 + start + tick)
        return out

    b.rewriter["pwm1"] = 200
    events = ticks(10.0, 3)
    assert events[-1].kind == "conflict" and events[-1].message.endswith("taken again in 10 min")
    assert ticks(13.0, 599) == [] and knob.id in applier.stepped_back  # stepped back at 12 s: until 612 s
    del b.rewriter["pwm1"]  # the other program is gone
    (back,) = ticks(612.0, 1)
    assert back.kind == "recovered" and back.data["why"] == "retake"
    assert knob.id not in applier.stepped_back and knob.id not in applier.alarms
    assert b.pwm["pwm1"] == 153 and ticks(613.0, 5) == []  # on its curve again, nothing behind our back
    b.rewriter["pwm1"] = 200  # it is back: stepping back again, for twice as long
    events = ticks(700.0, 3)
    assert events[-1].kind == "conflict" and events[-1].message.endswith("taken again in 20 min")
    assert ticks(703.0, 1199) == [] and [e.kind for e in ticks(1902.0, 1)] == ["recovered"]


def test_safety_never_gives_up_a_knob_stepped_back_from(setup):
    """After stepping back from a program that keeps rewriting the pump to 0 %, a critical temperature's
    full duty is still written, every tick it does not hold; policy decisions stay stepped back."""
    b, j, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    b.rewriter["pwm1"] = 0
    for tick in range(3):
        sample = b.sample()
        applier.observe(knob, sample.knobs[knob.id], 10.0 + tick, 100.0 + tick)
        applier.apply(b, knob, b.device_id, DEC, 60.0, sample.knobs[knob.id], 100.0 + tick)
    assert knob.id in applier.stepped_back
    alarm = applier.alarms[knob.id]
    assert alarm.kind == "conflict" and "safety decisions still are" in alarm.message
    writes = len(b.writes)
    crit = Decision(knob.id, 100.0, Layer.SAFETY, "safety/critical-temperature")
    kinds = []
    for tick in range(3):
        sample = b.sample()  # the other program wrote 0 again
        assert applier.observe(knob, sample.knobs[knob.id], 20.0 + tick, 200.0 + tick) == []
        after, events = applier.apply(b, knob, b.device_id, crit, 100.0, sample.knobs[knob.id], 200.0 + tick)
        assert after.value == 100.0
        kinds.append([e.kind for e in events])
    assert b.writes[writes:] == [(knob.id, 100.0)] * 3
    assert kinds == [["conflict", "actuation"], ["actuation"], ["actuation"]]  # the override said once
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, b.sample().knobs[knob.id], 300.0)
    assert len(b.writes) == writes + 3  # a policy decision is still not written: the fan is handed back
    # (handed back at the step-back, then again once the safety writes are over; the original both times)
    assert [e.kind for e in events] == ["restore"]
    assert b.restored == [(knob.id, {"pwm": 100, "enable": 2, "to_writer": True})] * 2


def test_a_fan_whose_read_back_lags_settling_on_its_request_is_no_drift(setup):
    """Drivers that report the ramping output (amdgpu on SMU13, EC levels) read back part of the way just
    after a write and the rest a tick later: that moves toward what was asked, not behind our back. Three
    of them made the daemon step back and leave the fan manual, off its curve."""
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)  # read back 60 %
    for tick, raw in enumerate((143, 148, 153, 158)):  # 56 %, 58 %, 60 %, 62 %: within 5 % of the 60 % asked
        b.pwm["pwm1"] = raw
        assert applier.observe(knob, current(b, knob), 10.0 + tick, 10.0 + tick) == []
    b.pwm["pwm1"] = 200  # 78 %: someone else
    assert [e.kind for e in applier.observe(knob, current(b, knob), 20.0, 20.0)] == ["drift"]
    assert not applier.stepped_back


def test_a_single_change_long_ago_does_not_add_up_to_a_conflict(setup):
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    for tick in range(4):
        b.pwm["pwm1"] = 10 + tick
        assert [e.kind for e in applier.observe(knob, current(b, knob), 100.0 * tick, 0.0)] == ["drift"]
        applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 0.0)
    assert not applier.stepped_back


def test_mode_changed_behind_our_back(setup):
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    b.enable["pwm1"] = 2  # a resume put the chip back in automatic
    events = applier.observe(knob, current(b, knob), 2.0, 2.0)
    assert [e.kind for e in events] == ["drift"] and "mode manual → auto" in events[0].message


def test_dry_run_writes_nothing_not_even_the_journal(tmp_path):
    b = FakeBackend(start_pwm=100)
    j = Journal(tmp_path)
    applier = Applier(j, dry_run=True)
    knob = b.discover()[0].knobs[0]
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    assert [e.kind for e in events] == ["actuation"] and events[0].data["dry_run"] is True
    assert b.writes == [] and b.pwm["pwm1"] == 100 and not j.dirty
    assert not list(tmp_path.iterdir())


def test_write_fault_is_reported_once_and_never_raises(setup):
    b, _, applier, knob = setup
    b.fail_write["pwm1"] = NoPermission("EACCES")
    _, e1 = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    _, e2 = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 2.0)
    assert [e.kind for e in e1] == ["fault"] and "EACCES" in e1[0].message and e2 == []
    assert knob.id in applier.faults
    del b.fail_write["pwm1"]
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 3.0)
    assert knob.id not in applier.faults


def test_a_write_fault_at_a_moving_value_is_reported_once_not_at_every_new_value(setup):
    """A curve asking 41 %, 42 %, 43 % of a fan whose writes are refused: one error line, not one per tick
    (the text names the value asked); another error is reported again."""
    b, _, applier, knob = setup
    reported = []
    for t, value in enumerate((41.0, 42.0, 43.5)):
        b.fail_write["pwm1"] = OSError(16, f"{knob.id} := {value:g} %: Device or resource busy")
        reported += applier.apply(b, knob, b.device_id, DEC, value, current(b, knob), float(t))[1]
    assert [e.message for e in reported] == [
        f"{knob.id}: write failed: OSError: [Errno 16] {knob.id} := 41 %: Device or resource busy"]
    assert applier.faults[knob.id].endswith(":= 43.5 %: Device or resource busy")  # the latest, for status
    b.fail_write["pwm1"] = NoPermission(f"{knob.id} := 44 %: Operation not permitted")
    _, events = applier.apply(b, knob, b.device_id, DEC, 44.0, current(b, knob), 4.0)
    assert [e.kind for e in events] == ["fault"] and "Operation not permitted" in events[0].message


def test_a_journal_that_cannot_be_written_stops_policy_writes_but_never_a_safety_write(setup):
    """The state directory full (ENOSPC): journal-first refused every write, the failed sensor's full duty
    included. A safety value is safe to leave behind, so it is written, its original kept in memory (a
    clean stop puts it back) and the fault said; a policy write still waits for the journal."""
    from aithermd.actuate.journal import JournalError

    b, j, applier, knob = setup

    def full(entries):
        raise JournalError(f"{j.path}: cannot write the journal: No space left on device")

    j._save = full
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    assert b.writes == [] and [e.kind for e in events] == ["fault"] and knob.id not in j
    failed = Decision(knob.id, 100.0, Layer.SAFETY, "safety/failed-source")
    after, events = applier.apply(b, knob, b.device_id, failed, 100.0, current(b, knob), 2.0)
    assert b.writes == [(knob.id, 100.0)] and after.value == 100.0
    assert [e.kind for e in events] == ["actuation"]  # the journal's fault was said at the first refusal
    assert j.entries()[knob.id].saved == {"pwm": 100, "enable": 2}  # in memory, for the stop's restore


def test_read_only_knob_is_never_written(setup):
    b, _, applier, knob = setup
    ro = Knob(knob.id, knob.device_id, knob.kind, knob.unit, 0, 100, None, False, "no pwm1_enable")
    assert applier.apply(b, ro, b.device_id, DEC, 60.0, current(b, knob), 1.0)[1] == []
    assert b.writes == []


def test_give_back_restores_the_original_and_forgets_it(setup):
    b, j, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    events = applier.give_back(b, knob, 2.0)
    assert [e.kind for e in events] == ["restore"]
    assert b.pwm["pwm1"] == 100 and b.enable["pwm1"] == 2
    assert knob.id not in j and knob.id not in applier.owned
    assert applier.give_back(b, knob, 3.0) == []  # nothing owned: nothing to do


def test_a_write_logs_at_info_only_when_its_rule_or_layer_changes(setup):
    import logging

    import structlog
    from structlog.testing import capture_logs

    b, _, applier, knob = setup
    other = Decision("x", 90.0, Layer.SAFETY, "safety/critical")
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            for value, dec in ((60.0, DEC), (70.0, DEC), (80.0, DEC), (100.0, other), (50.0, DEC)):
                _, events = applier.apply(b, knob, b.device_id, dec, value, current(b, knob), 1.0)
                assert [e.kind for e in events] == ["actuation"]  # every write is still an event
    finally:
        structlog.configure(**saved)
    acts = [(e["log_level"], e["new"], e["rule"]) for e in logs if e["event"] == "actuation"]
    assert acts == [("info", 60.0, "balanced/cpu-fans"), ("debug", 70.0, "balanced/cpu-fans"),
                    ("debug", 80.0, "balanced/cpu-fans"), ("info", 100.0, "safety/critical"),
                    ("info", 50.0, "balanced/cpu-fans")]


def test_events_carry_short_numbers_not_long_floats(setup):
    """A pwm read back as 100/255 is 39.2156862745098 %: events and their messages say 39.2."""
    b, _, applier, knob = setup
    _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 1.0)
    (event,) = events
    assert event.data["old"] == 39.22 and event.message == f"{knob.id}: 39.2 → 60 % (balanced/cpu-fans)"


def test_firmware_resetting_fans_just_after_a_resume_is_written_over_not_a_conflict(setup):
    """Three suspends in a minute, each followed 1.5 s after the resume by the EC putting the chip back in
    automatic at full speed: that was three "changes by another program" and a step-back for 10 min."""
    b, _, applier, knob = setup
    applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), 0.0)
    for t in (10.0, 25.0, 40.0):
        applier.pause()
        applier.resume(t)
        b.enable["pwm1"], b.pwm["pwm1"] = 5, 255  # the firmware, a moment after the resume
        assert applier.observe(knob, current(b, knob), t + 1.5, t + 1.5) == []
        _, events = applier.apply(b, knob, b.device_id, DEC, 60.0, current(b, knob), t + 2.0)
        assert [e.kind for e in events] == ["actuation"] and b.enable["pwm1"] == 1
    assert not applier.stepped_back and applier.alarms == {}
    b.pwm["pwm1"] = 20  # 31 s after the last resume: another program again, counted
    assert [e.kind for e in applier.observe(knob, current(b, knob), 71.0, 71.0)] == ["drift"]
