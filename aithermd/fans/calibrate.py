"""``fans calibrate``: per pwm, the levels its driver keeps, the RPM at each duty, the stop duty (from
running) and the start duty (from standstill), each read once the fans settled.

fan2go's initialisation finds the lowest duty a fan *starts* at, by sweeping from the bottom, and warns that
pwmconfig's "MINSTOP" (found sweeping down) is another number (fan2go #49): a fan keeps turning well below
the duty it needs to start. Both matter, so both are measured, with settle times:

1. **levels**: a few probe values are written and read back; when the driver keeps other values (dell_smm's
   3 states, amdgpu's whole percents) every raw value 0–255 is written and read back (as fan2go's
   ``setPwmToGetPwmMap``) and the duties below are taken from the levels it keeps;
2. **RPM curve and stop duty, from running**: full duty, then down in :data:`COARSE_STEP_PCT` steps until a
   fan stops; back up above that step and down again one level at a time: the stop duty is the lowest duty
   at which every fan of the pwm still turned;
3. **start duty, from standstill**: the fans stop (0 %, settled), then a candidate duty is held for
   :data:`START_WAIT_S`; upward in steps of half :data:`COARSE_STEP_PCT` from the stop duty until they
   start, then bisecting the last step: the start duty is the lowest duty that started every fan of the
   pwm (a fan's start threshold is one duty: starting is monotone in it).

The other pwms under calibration stay at full meanwhile. A pwm that no fan input follows is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from aithermd.fans.lab import Lab
from aithermd.fans.store import FanSetup
from aithermd.model import FanCalibration
from aithermd.units import PWM_MAX, pwm_to_pct

COARSE_STEP_PCT = 10.0
START_WAIT_S = 6.0  # a fan that starts at a duty turns within a few seconds (its spin-up time constant)
SPINNING_RPM = 50.0
PROBES = (1, 37, 60, 101, 128, 163, 200, 254)


def _spinning(rpm: dict[str, float]) -> bool:
    return all(v > SPINNING_RPM for v in rpm.values())


def learn_levels(lab: Lab, pwm: str) -> tuple[int, ...]:
    """The raw values the driver keeps (empty when it keeps every one). Leaves the pwm at full."""
    quantised = False
    for raw in PROBES:
        lab.set(pwm, pwm_to_pct(raw))
        got = lab.raw(pwm)
        if got is not None and got < raw:  # the knob rounds up: a smaller read-back means levels
            quantised = True
            break
        if got is not None and got != raw:
            quantised = True
            break
    levels: tuple[int, ...] = ()
    if quantised:
        seen = set()
        for raw in range(PWM_MAX + 1):
            lab.backend.write_knob(pwm, raw * 100.0 / PWM_MAX)
            got = lab.raw(pwm)
            if got is not None:
                seen.add(got)
        levels = tuple(sorted(seen))
    lab.set(pwm, 100.0)
    return levels


def _duties(levels: Sequence[int], top: float, bottom: float, step: float) -> list[float]:
    """Duties from ``top`` down to ``bottom`` every ``step`` %, each moved to a level the driver keeps."""
    out: list[float] = []
    d = top
    while d >= bottom - 1e-9:
        pct = _at_level(levels, d)
        if not out or abs(out[-1] - pct) > 1e-9:
            out.append(pct)
        d -= step
    return out


def _at_level(levels: Sequence[int], pct: float) -> float:
    if not levels:
        return pct
    raw = min((lv for lv in levels if pwm_to_pct(lv) >= pct - 1e-9), default=levels[-1])
    return pwm_to_pct(raw)


def _fine(levels: Sequence[int], top: float, bottom: float) -> list[float]:
    """Every duty the driver keeps from ``top`` down to ``bottom``, one level (or one raw step) at a time."""
    raws = levels or range(PWM_MAX + 1)
    return sorted({pwm_to_pct(r) for r in raws if bottom - 1e-9 <= pwm_to_pct(r) <= top + 1e-9}, reverse=True)


def calibrate_pwm(lab: Lab, pwm: str, tachs: Sequence[str]) -> FanCalibration:
    """Levels, RPM curve, stop and start duty of ``pwm`` whose fans are read by ``tachs`` (see the module
    doc). Raises LabAborted."""
    levels = learn_levels(lab, pwm)
    if levels:
        lab.say(f"{pwm}: its driver keeps {len(levels)} levels ({', '.join(map(str, levels[:8]))}"
                f"{', ...' if len(levels) > 8 else ''})")
    curve: dict[float, dict[str, float]] = {}
    lab.set(pwm, 100.0)
    curve[100.0] = lab.settle(tachs, min_s=2.0)
    stopped_at: float | None = None
    last_running = 100.0
    for duty in _duties(levels, 100.0 - COARSE_STEP_PCT, 0.0, COARSE_STEP_PCT):
        lab.set(pwm, duty)
        rpm = lab.settle(tachs, min_s=2.0)
        if not _spinning(rpm):
            stopped_at = duty
            break
        curve[duty] = rpm
        last_running = duty
    stop_pct = last_running
    if stopped_at is not None:  # start them again (from full), then down from the last duty they turned at
        lab.set(pwm, 100.0)
        lab.settle(tachs, min_s=2.0)
        lab.set(pwm, last_running)
        lab.settle(tachs, min_s=2.0)
        for duty in _fine(levels, last_running, stopped_at)[1:]:
            lab.set(pwm, duty)
            rpm = lab.settle(tachs, min_s=2.0)
            if not _spinning(rpm):
                break
            curve[duty] = rpm
            stop_pct = duty
    else:
        stop_pct = min(curve)
    lab.say(f"{pwm}: keeps turning down to {stop_pct:.1f} %")
    start_pct = _start(lab, pwm, tachs, levels, stop_pct)
    lab.say(f"{pwm}: starts from standstill at {start_pct:.1f} %")
    lab.set(pwm, 100.0)
    rpm_points = {t: tuple((d, round(curve[d][t], 1)) for d in sorted(curve)) for t in tachs}
    return FanCalibration(tachs=tuple(tachs), start_pct=round(start_pct, 2), stop_pct=round(stop_pct, 2),
                          rpm=MappingProxyType(rpm_points), levels=levels, calibrated=True)


def _start(lab: Lab, pwm: str, tachs: Sequence[str], levels: Sequence[int], stop_pct: float) -> float:
    def starts(duty: float) -> bool:
        lab.set(pwm, 0.0)
        lab.settle(tachs, min_s=2.0)
        lab.set(pwm, duty)
        lab.wait(START_WAIT_S)
        return _spinning(lab.rpm(tachs))

    lo, hi = stop_pct, None  # lo: did not start (or the stop duty, below any start); hi: started
    duty = stop_pct
    while duty < 100.0:
        duty = _at_level(levels, min(100.0, duty + COARSE_STEP_PCT / 2))
        if starts(duty):
            hi = duty
            break
        lo = duty
    if hi is None:
        return 100.0
    between = _fine(levels, hi, lo)[1:-1][::-1]  # the levels strictly between, upward
    a, b = 0, len(between)  # bisect: the lowest of them that starts the fans, else hi
    while a < b:
        mid = (a + b) // 2
        if starts(between[mid]):
            b = mid
        else:
            a = mid + 1
    return between[a] if a < len(between) else hi


def calibrate(lab: Lab, setup: FanSetup, pwms: Sequence[str], wall: float) -> FanSetup:
    """Calibrate each of ``pwms`` that has fan inputs in ``setup`` (the others at full meanwhile); returns
    the setup with the calibrations. Raises LabAborted."""
    for p in pwms:
        lab.set(p, 100.0)
    pwm_map = dict(setup.pwms)
    for p in pwms:
        cal = pwm_map.get(p)
        if cal is None or not cal.tachs:
            lab.say(f"{p}: no fan input follows it: nothing to calibrate")
            continue
        pwm_map[p] = calibrate_pwm(lab, p, cal.tachs)
    return replace(setup, pwms=MappingProxyType(pwm_map), calibrated_wall=wall)
