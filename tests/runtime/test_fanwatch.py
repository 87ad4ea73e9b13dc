"""The stall detector on its own (runtime/fanwatch.py), tick by tick: what counts as a stall, the kick, the
alarm, recovery, empty headers, and a fan between its stop and start duty that is neither."""

from __future__ import annotations

from dataclasses import replace

from aithermd.model import FanCalibration, KnobValue, Reading, Status
from aithermd.runtime.fanwatch import BLIND_FOR_S, BLIND_KICKS, CONFIRM_S, KICK_S, RECOVER_S, FanWatch
from tests.policy.machines import NCT, nct

FAN1, FAN2, PWM1, PWM2 = f"{NCT}/fan1", f"{NCT}/fan2", f"{NCT}/pwm1", f"{NCT}/pwm2"
CAL = FanCalibration(tachs=(FAN1,), start_pct=30.0, stop_pct=20.0,
                     rpm={FAN1: ((20.0, 400.0), (100.0, 2000.0))}, calibrated=True)


def devices(cal1=CAL, cal2=None):
    dev = nct()
    knobs = (replace(dev.knobs[0], fan=cal1), replace(dev.knobs[1], fan=cal2))
    return (replace(dev, knobs=knobs),)


class Run:
    def __init__(self, devs):
        self.devs, self.watch, self.t, self.events = devs, FanWatch(), 0.0, []

    def tick(self, rpm1, duty1, rpm2=900.0, duty2=50.0, dt=1.0, paused=False):
        self.t += dt
        readings = {FAN1: Reading(FAN1, rpm1), FAN2: Reading(FAN2, rpm2)}
        knobs = {PWM1: KnobValue(PWM1, duty1, "manual"), PWM2: KnobValue(PWM2, duty2, "manual")}
        self.events += self.watch.check(self.devs, readings, knobs, self.t, 1000.0 + self.t, paused=paused)
        return dict(self.watch.actions)

    def kinds(self):
        return [(e.kind, e.data.get("alarm"), e.subject) for e in self.events]


def test_a_fan_that_stops_under_duty_is_kicked_then_stalled_then_recovers():
    r = Run(devices())
    r.tick(1000, 50)
    assert r.tick(0, 50) == {}  # low, not yet confirmed
    for _ in range(int(CONFIRM_S)):
        actions = r.tick(0, 50)
    assert actions == {PWM1: "kick"}
    for _ in range(int(KICK_S)):
        actions = r.tick(0, 100)  # the safety layer holds it at full
    assert actions == {PWM1: "failed"} and r.watch.alarms[FAN1].kind == "stalled"
    for _ in range(int(RECOVER_S)):
        r.tick(1900, 100)
    assert r.tick(1900, 100) == {} and FAN1 not in r.watch.alarms
    assert r.kinds() == [("alarm", "kick", FAN1), ("alarm", "stalled", FAN1),
                         ("recovered", "recovered", FAN1)]


def test_while_writes_are_paused_no_fan_is_judged_and_a_stall_already_called_stays():
    r = Run(devices())
    r.tick(1000, 50)
    for _ in range(int(CONFIRM_S) + int(KICK_S) + 2):  # PrepareForSleep(true): a kick would not be written
        assert r.tick(0, 50, paused=True) == {}
    assert r.events == [] and r.watch.alarms == {}
    assert r.tick(0, 50) == {}  # writes again: low, confirmed CONFIRM_S later as ever
    for _ in range(int(CONFIRM_S)):
        actions = r.tick(0, 50)
    assert actions == {PWM1: "kick"}
    for _ in range(int(KICK_S)):
        r.tick(0, 100)
    assert r.tick(0, 100, paused=True) == {PWM1: "failed"}  # still stalled, still a failed cooler
    assert r.watch.alarms[FAN1].kind == "stalled"


def test_a_fan_far_below_its_calibrated_speed_counts_as_stalled():
    r = Run(devices())
    r.tick(1200, 60)
    for _ in range(int(CONFIRM_S) + 1):
        r.tick(300, 60)  # 60 % should give ~1200 RPM: 300 is under 30 % of it (a failing bearing)
    assert r.watch.actions == {PWM1: "kick"}


def test_a_kick_that_frees_the_fan_is_no_alarm():
    r = Run(devices())
    r.tick(1000, 50)
    for _ in range(int(CONFIRM_S) + 1):
        r.tick(0, 50)
    r.tick(1500, 100)
    assert r.watch.actions == {} and r.watch.alarms == {}
    assert r.kinds() == [("alarm", "kick", FAN1), ("recovered", "recovered", FAN1)]


def test_a_still_fan_between_its_stop_and_start_duty_is_not_a_stall():
    r = Run(devices())
    r.tick(0, 0)
    for _ in range(10):
        r.tick(0, 25)  # under its 30 % start duty: a still fan stays still, as it should
    assert r.watch.actions == {} and r.events == []
    r.tick(800, 40)
    for _ in range(10):
        r.tick(500, 25)  # running: keeps turning above its 20 % stop duty
    assert r.watch.actions == {}


def test_an_empty_header_found_by_detection_is_reported_once_and_never_kicked():
    r = Run(devices(cal2=FanCalibration(tachs=())))
    for _ in range(10):
        r.tick(1000, 50, rpm2=0, duty2=100)
    assert r.watch.alarms[PWM2].kind == "empty" and r.kinds() == [("alarm", "empty", PWM2)]
    assert r.watch.actions == {}


def test_paired_by_number_a_tach_that_never_turned_is_empty_not_stalled():
    r = Run(devices(cal1=None))
    for _ in range(int(CONFIRM_S + KICK_S) + 3):
        r.tick(0, 60)
    assert r.watch.alarms[FAN1].kind == "empty"
    assert ("alarm", "stalled", FAN1) not in r.kinds() and r.watch.actions == {}


def test_a_failed_tach_read_is_healths_not_a_stall():
    r = Run(devices())
    r.tick(1000, 50)
    for _ in range(10):
        r.t += 1
        readings = {FAN1: Reading(FAN1, None, Status.FAILED, "EIO"), FAN2: Reading(FAN2, 900.0)}
        knobs = {PWM1: KnobValue(PWM1, 50.0), PWM2: KnobValue(PWM2, 50.0)}
        r.watch.check(r.devs, readings, knobs, r.t, r.t)
    assert r.watch.actions == {} and r.watch.alarms == {}


def test_a_tach_that_reads_0_below_a_duty_while_the_fan_turns_is_learnt_not_kicked_for_ever():
    """attack6 G10: a 3-pin fan on a PWM-mode header (its tach powered only in the on-phase) reads 0 RPM
    under 55 % and its real speed above: uncalibrated, it was kicked to full every ~5 s for the daemon's life
    (50 → 100 → 50 %). After BLIND_KICKS kicks that freed it at once, its tach is not judged at or below
    50 % any more, said once; above it, a real stall is still kicked."""
    r = Run(devices(cal1=None))

    def fan(duty):  # what the tach shows
        return 0.0 if duty < 55 else 1800.0

    duty, kicks, duties = 50.0, 0, []
    for _ in range(60):
        actions = r.tick(fan(duty), duty)
        duty = 100.0 if actions.get(PWM1) == "kick" else 50.0  # the safety layer's kick, else the policy
        duties.append(duty)
    kicks = [k for k in r.kinds() if k[1] == "kick"]
    assert len(kicks) == BLIND_KICKS and duties[-30:] == [50.0] * 30  # then no more cycling
    blind = [e for e in r.events if e.data.get("alarm") == "blind"]
    assert len(blind) == 1 and blind[0].kind == "alarm" and blind[0].data["duty_pct"] == 50.0
    assert "cannot be read at or below 50 %" in blind[0].message and "fans calibrate" in blind[0].message
    # and it stands while it lasts (status, aithermd_fan_tach_blind), not only as an event (G10)
    assert {k: (a.kind, a.message) for k, a in r.watch.alarms.items()} == {FAN1: ("blind", blind[0].message)}
    for _ in range(int(CONFIRM_S) + 1):
        actions = r.tick(0.0, 80.0)  # stopped at 80 %, where its tach reads: a real stall, kicked
    assert actions == {PWM1: "kick"}


def test_a_fan_that_turns_only_when_kicked_is_never_learnt_blind_and_what_is_learnt_expires():
    """attack7 H2: a worn bearing that turns only at full duty read like a blind tach at 90 % and was never
    judged again: 0 RPM, no alarm, no failed cooler for the daemon's life. Above BLIND_MAX_PCT nothing is
    learnt (kicked, then called stalled); below it, what is learnt is judged again after BLIND_FOR_S."""
    r = Run(devices(cal1=None))
    duty = 90.0
    for _ in range(60):
        actions = r.tick(1800.0 if duty == 100.0 else 0.0, duty)
        duty = 100.0 if actions.get(PWM1) == "kick" else 90.0
    assert not [e for e in r.events if e.data.get("alarm") == "blind"]
    assert len([k for k in r.kinds() if k[1] == "kick"]) > BLIND_KICKS  # still kicked: judged every time

    r = Run(devices(cal1=None))
    duty = 50.0
    for _ in range(60):  # learnt blind at 50 %, as in the G10 test
        actions = r.tick(0.0 if duty < 55 else 1800.0, duty)
        duty = 100.0 if actions.get(PWM1) == "kick" else 50.0
    assert [e.data["duty_pct"] for e in r.events if e.data.get("alarm") == "blind"] == [50.0]
    kicks = len([k for k in r.kinds() if k[1] == "kick"])
    assert r.watch.alarms[FAN1].kind == "blind"
    for _ in range(int(BLIND_FOR_S / 60) + 2):
        r.tick(0.0, 50.0, dt=60.0)  # half an hour later it is judged again: low, then kicked
    assert len([k for k in r.kinds() if k[1] == "kick"]) == kicks + 1
    assert r.watch.alarms[FAN1].kind == "stalled"  # judged again: the blind alarm gave way to the stall
