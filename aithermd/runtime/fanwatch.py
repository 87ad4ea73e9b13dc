"""Stall detection: a fan under duty that does not turn gets a kick-start, then an alarm, and its zone is
treated as a failed cooler.

Each tick, for every hwmon pwm and each fan input (``fanN``) it drives — the detected ones
(:attr:`~aithermd.model.FanCalibration.tachs`), else ``fanN`` of ``pwmN`` — the duty read back and the
RPM read are compared. A fan is *low* when it reads 0 RPM, or less than :data:`FAR_BELOW` of the RPM its
calibration measured at that duty, while the duty should turn it: above its stop duty (plus
:data:`STOP_MARGIN_PCT`) when it was turning a tick ago, above its start duty when it was still — a fan
between the two keeps its state (calibrated duties, else :data:`DEFAULT_START_PCT` for both). Then, per
fan input:

1. low for :data:`CONFIRM_S` → **kick**: the safety layer writes full duty (a stuck fan often frees itself
   at full voltage: FanControl #3855, fan2go #1);
2. still low after :data:`KICK_S` at full → **stalled**: an alarm (event, ``aithermd_fan_stalled``,
   ``aithermctl status``); the pwm stays at full, and — when detection confirmed that this input follows
   this pwm — its zone is a failed cooler (:func:`aithermd.policy.safety.evaluate`: the zone's other fans
   to full, the power limits of the devices it cools to their minimum);
3. turning again for :data:`RECOVER_S` → ok, said once.

A fan that a kick frees every time and that reads 0 again at the same duty — :data:`BLIND_KICKS` kicks within
:data:`BLIND_WINDOW_S` — has a tach that cannot be read there, not a stuck rotor: a 3-pin fan on a header in
PWM mode (its tach is powered only in the PWM on-phase), an old Super I/O whose fan-divisor counter
overflows at low speed. It is said once (an ``alarm`` event ``blind``, suggesting ``aithermctl fans
calibrate``), stands as a ``blind`` alarm (``aithermctl status``, ``aithermd_fan_tach_blind``) while it
lasts, and is not judged at or below that duty for :data:`BLIND_FOR_S`: before, it was kicked to full
every ~5 s for the daemon's life, 50 → 100 → 50 % (attack6 G10). It is still judged above that duty, so a
stall there is caught; and only up to :data:`BLIND_MAX_PCT`: a fan that reads nothing at a high duty until
kicked is a fan that turns only when kicked, kicked and then called stalled as ever.

A fan input that has never turned since the daemon started and that detection has not placed behind this
pwm is not called stalled but **empty** (nothing connected, or a tach that follows another pwm): reported
once, after the same kick, with no failed cooler. A pwm that detection found drives no fan input is
reported empty at once and never kicked. The hot path is a few dict lookups per fan and tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from aithermd.fans.store import expected_rpm
from aithermd.model import Alarm, Device, Event, KnobKind, KnobValue, Reading, Status

CONFIRM_S = 3.0  # "a few seconds": a fan needs about 1 s to spin up (sim/fans.py), a stall lasts
KICK_S = 4.0  # full duty this long before the stall is called (4 spin-up time constants)
RECOVER_S = 2.0
FAR_BELOW = 0.3  # under 30 % of its calibrated RPM at this duty counts as not turning
DEFAULT_START_PCT = 40.0  # uncalibrated: above this every fan of Intel's 4-wire PWM specification turns
STOP_MARGIN_PCT = 2.0  # a running fan is expected to turn this far above its calibrated stop duty
TURNING_RPM = 1.0
BLIND_KICKS = 3  # kicks that freed the fan at once, at the same duty, within BLIND_WINDOW_S: a blind tach
BLIND_WINDOW_S = 120.0
# A tach blind above this duty is no PWM-phase artefact (the on-phase powers it most of the time) but a fan
# that turns only when kicked: a stall, never learnt away (attack7 H2: a worn bearing learnt "blind" at 90 %)
BLIND_MAX_PCT = 60.0
BLIND_FOR_S = 1800.0  # what is learnt is judged again after this long: one kick-start per half hour at most

KICK, STALLED, BLIND = "kick", "stalled", "blind"


@dataclass(slots=True)
class _Watch:
    knob_id: str
    tach: str
    start_pct: float
    stop_pct: float
    cal: object | None  # FanCalibration with an RPM curve, or None
    confirmed: bool  # detection placed this tach behind this pwm
    phase: str = "ok"  # ok | low | kick | stalled | empty
    since: float = 0.0
    turned: bool = False  # it has turned since the daemon started
    turning: bool = False  # it turned at the last tick
    low_duty: float = 0.0  # the duty at which it was last found low
    freed: tuple[tuple[float, float], ...] = ()  # (monotonic s, duty %) of kicks that freed it at once
    blind_pct: float = -1.0  # its tach is not read at or below this duty (learnt: see the module doc)
    blind_until: float = 0.0  # monotonic s: judged again at and below blind_pct from then on


class FanWatch:
    """The stall detector of one daemon run (see the module doc)."""

    def __init__(self) -> None:
        self._devices: tuple[Device, ...] | None = None
        self._watches: list[_Watch] = []
        self._empty_pwms: dict[str, str] = {}
        self.alarms: dict[str, Alarm] = {}
        self.actions: dict[str, str] = {}  # knob id → "kick" | "stalled" (full duty) | "failed" (zone)
        self._log = structlog.get_logger("aithermd.fans")

    def _plan(self, devices: tuple[Device, ...], t_wall: float, events: list[Event]) -> None:
        old = {(w.knob_id, w.tach): w for w in self._watches}
        self._watches, self._empty_pwms = [], {}
        for dev in devices:
            if dev.kind != "hwmon":
                continue
            channels = {c.id for c in dev.channels}
            for k in dev.knobs:
                if k.kind is not KnobKind.PWM:
                    continue
                cal = k.fan
                if cal is not None and not cal.tachs:
                    self._empty_pwms[k.id] = (f"{k.id}: detection found no fan input following it (an empty "
                                              "header)")
                    continue
                tachs = cal.tachs if cal is not None else ((k.fan_channel,) if k.fan_channel else ())
                start = cal.start_pct if cal is not None and cal.start_pct is not None else DEFAULT_START_PCT
                known = cal is not None and cal.stop_pct is not None
                stop = cal.stop_pct + STOP_MARGIN_PCT if known else start  # type: ignore[union-attr]
                for t in tachs:
                    if t not in channels:
                        continue
                    w = _Watch(k.id, t, start, min(stop, start), cal if cal is not None and cal.rpm else None,
                               cal is not None)
                    prev = old.get((k.id, t))
                    if prev is not None:
                        w.phase, w.since = prev.phase, prev.since
                        w.turned, w.turning = prev.turned, prev.turning
                        w.low_duty, w.freed, w.blind_pct = prev.low_duty, prev.freed, prev.blind_pct
                        w.blind_until = prev.blind_until
                    self._watches.append(w)
        for knob_id, message in self._empty_pwms.items():
            if knob_id not in self.alarms:
                self.alarms[knob_id] = Alarm("empty", message, t_wall)
                events.append(self._event("empty", t_wall, knob_id, message))
        self._devices = devices

    def check(self, devices: tuple[Device, ...], readings: Mapping[str, Reading],
              knobs: Mapping[str, KnobValue], t_mono: float, t_wall: float, *,
              paused: bool = False) -> list[Event]:
        """One tick: update every fan's phase; :attr:`actions` and :attr:`alarms` afterwards; the events.
        While writes are ``paused`` (the machine is going to sleep) no fan is judged: a kick would not be
        written, so a fan low or being kicked starts over once writes resume; a stall already called
        stays."""
        events: list[Event] = []
        if devices is not self._devices:
            self._plan(devices, t_wall, events)
        actions: dict[str, str] = {}
        if paused:
            for w in self._watches:
                if w.phase in ("low", KICK):
                    w.phase = "ok"
                elif w.phase == STALLED:
                    actions[w.knob_id] = "failed" if w.confirmed else STALLED
            self.actions = actions
            return events
        for w in self._watches:
            r = readings.get(w.tach)
            kv = knobs.get(w.knob_id)
            if r is None or r.status is not Status.OK or r.value is None or kv is None or kv.value is None:
                continue  # a failed tach or pwm read is health's to report
            rpm, duty = float(r.value), float(kv.value)
            if w.blind_pct >= 0.0 and t_mono >= w.blind_until:
                w.blind_pct = -1.0  # judged again (a tach blind for good is learnt again, three kicks on)
                if (alarm := self.alarms.get(w.tach)) is not None and alarm.kind == BLIND:
                    del self.alarms[w.tach]
            should = duty > max(w.stop_pct if w.turning else w.start_pct, w.blind_pct)
            low = should and (rpm <= TURNING_RPM or self._far_below(w, rpm, duty))
            w.turning = rpm > TURNING_RPM
            w.turned = w.turned or w.turning
            if low and w.phase in ("ok", "low"):
                w.low_duty = duty
            self._step(w, low, t_mono, t_wall, events)
            if w.phase in (KICK, STALLED):
                stalled = w.phase == STALLED and w.confirmed
                if actions.get(w.knob_id) != "failed":
                    actions[w.knob_id] = "failed" if stalled else w.phase
        self.actions = actions
        return events

    @staticmethod
    def _far_below(w: _Watch, rpm: float, duty: float) -> bool:
        if w.cal is None:
            return False
        expected = expected_rpm(w.cal, w.tach, duty)  # type: ignore[arg-type]
        return expected is not None and rpm < FAR_BELOW * expected

    def _step(self, w: _Watch, low: bool, t_mono: float, t_wall: float, events: list[Event]) -> None:
        phase = w.phase
        if phase in ("ok", "low"):
            if not low:
                w.phase = "ok"
            elif phase == "ok":
                w.phase, w.since = "low", t_mono
            elif t_mono - w.since >= CONFIRM_S:
                w.phase, w.since = KICK, t_mono
                events.append(self._event("kick", t_wall, w.tach, f"{w.tach} reads no speed under "
                                          f"{w.knob_id}'s duty: kick-start (full duty)", knob=w.knob_id))
        elif phase == KICK:
            if not low:
                w.phase = "ok"
                events.append(self._event("recovered", t_wall, w.tach, f"{w.tach} turns again after the "
                                          "kick-start", knob=w.knob_id))
                self._freed(w, t_mono, t_wall, events)
            elif t_mono - w.since >= KICK_S:
                if w.turned or w.confirmed:
                    w.phase, w.since = STALLED, t_mono
                    zone = " Its zone is treated as a failed cooler." if w.confirmed else \
                        " (paired by number: run 'aithermctl fans detect' to confirm it follows this pwm)"
                    message = f"{w.tach} has stalled: no speed at full duty after a kick-start.{zone}"
                    self.alarms[w.tach] = Alarm(STALLED, message, t_wall)
                    events.append(self._event(STALLED, t_wall, w.tach, message, knob=w.knob_id))
                else:
                    w.phase = "empty"
                    message = (f"{w.tach} has read 0 RPM since the start, even at full duty: nothing "
                               "connected to this header, or a fan that follows another pwm than "
                               f"{w.knob_id}")
                    self.alarms[w.tach] = Alarm("empty", message, t_wall)
                    events.append(self._event("empty", t_wall, w.tach, message, knob=w.knob_id))
        elif phase == STALLED:
            if low:
                w.since = t_mono
            elif t_mono - w.since >= RECOVER_S:
                w.phase = "ok"
                self.alarms.pop(w.tach, None)
                events.append(self._event("recovered", t_wall, w.tach, f"{w.tach} turns again: stall cleared",
                                          knob=w.knob_id))
        elif phase == "empty" and w.turned:
            w.phase = "ok"
            self.alarms.pop(w.tach, None)

    def _freed(self, w: _Watch, t_mono: float, t_wall: float, events: list[Event]) -> None:
        """A kick freed ``w`` at once: the :data:`BLIND_KICKS`-th within :data:`BLIND_WINDOW_S` makes its tach
        blind at and below the highest duty those kicks found it low at (said once per duty learnt)."""
        w.freed = (*(f for f in w.freed if f[0] > t_mono - BLIND_WINDOW_S), (t_mono, w.low_duty))
        duty = max(d for _t, d in w.freed)
        if len(w.freed) < BLIND_KICKS or duty > BLIND_MAX_PCT:
            return
        w.blind_pct, w.freed, w.blind_until = max(w.blind_pct, duty), (), t_mono + BLIND_FOR_S
        message = (f"{w.tach} reads no speed at {w.blind_pct:.0f} % duty but turns at once at full duty "
                   f"({BLIND_KICKS} kick-starts in {BLIND_WINDOW_S:.0f} s): its speed cannot be read at or "
                   f"below {w.blind_pct:.0f} % (a 3-pin fan on a PWM-mode header, a fan-divisor overflow), "
                   "so it is not kick-started there any more; 'aithermctl fans calibrate' measures where it "
                   "reads")
        if w.tach not in self.alarms:  # a stall or an empty header stands over it
            self.alarms[w.tach] = Alarm(BLIND, message, t_wall)
        events.append(self._event(BLIND, t_wall, w.tach, message, knob=w.knob_id, duty_pct=w.blind_pct))

    def _event(self, what: str, t_wall: float, subject: str, message: str, **data: object) -> Event:
        level = self._log.error if what == STALLED else \
            self._log.warning if what in (KICK, "empty", "blind") else self._log.info
        level("fan_" + what, subject=subject, message=message, **data)
        kind = "alarm" if what in (STALLED, "empty", KICK, "blind") else "recovered"
        return Event(kind, t_wall, subject, message, {"alarm": what, **data})
