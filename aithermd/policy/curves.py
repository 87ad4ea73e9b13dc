"""Fan curves as pure functions: (temperature, now, previous state) → (duty %, new state).

- ``points``: linear interpolation between [°C, %] points, flat beyond the ends; ``hysteresis_c`` keeps the
  reference temperature until the temperature has fallen that far (rises follow at once), as fan2go does.
- ``pid``: duty = base + kp·e + ki·∫e dt + kd·de/dt with e = temperature − setpoint (°C); the integral is
  clamped so it alone cannot push the duty outside 0–100 % (anti-windup).
- ``mix``: max/min/mean of other curves.
- Fan shaping (:func:`shape`): stop below a temperature, a minimum duty, a start duty to kick a stalled fan,
  and ramp limits in %/s up and down; a fan allowed to stop whose stop duty is known (calibrated) stops
  only once its duty falls ``stop_hysteresis_pct`` below that stop duty (held at it in between) and starts
  again only at it or above, with the start kick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aithermd.policy.kinds import MixCurve, PidCurve, PointsCurve


@dataclass(frozen=True, slots=True)
class CurveState:
    """Per curve instance: ``ref_c`` (hysteresis reference), PID ``integral`` (°C·s), ``prev_err``, ``t``."""

    ref_c: float | None = None
    integral: float = 0.0
    prev_err: float | None = None
    t: float | None = None


_FRESH = CurveState()  # a curve's state before its first tick (frozen: shared)


@dataclass(frozen=True, slots=True)
class FanState:
    """Per fan: the last duty sent (%) and when (s), for ramp limits and the start kick."""

    duty_pct: float | None = None
    t: float | None = None


def interpolate(points: Sequence[tuple[float, float]], temp_c: float) -> float:
    """Duty (%) at ``temp_c`` on the polyline ``points`` (temperatures increasing); flat beyond the ends."""
    if temp_c <= points[0][0]:
        return points[0][1]
    for (t0, d0), (t1, d1) in zip(points, points[1:], strict=False):
        if temp_c <= t1:
            return d0 + (d1 - d0) * (temp_c - t0) / (t1 - t0)
    return points[-1][1]


def points_step(curve: PointsCurve, temp_c: float, st: CurveState) -> tuple[float, CurveState]:
    ref = st.ref_c
    if ref is None or temp_c >= ref or ref - temp_c >= curve.hysteresis_c:
        ref = temp_c
    return interpolate(curve.points, ref), CurveState(ref_c=ref)


def pid_step(curve: PidCurve, temp_c: float, now: float, st: CurveState) -> tuple[float, CurveState]:
    if not math.isfinite(temp_c):  # nonsense (±inf): full duty, never NaN or zero; the state is kept
        return 100.0, st
    err = temp_c - curve.setpoint_c
    dt = now - st.t if st.t is not None and now > st.t else 0.0
    integral = st.integral + err * dt
    if curve.ki:
        lo, hi = sorted(((0.0 - curve.base_pct) / curve.ki, (100.0 - curve.base_pct) / curve.ki))
        integral = min(max(integral, lo), hi)
    deriv = (err - st.prev_err) / dt if st.prev_err is not None and dt > 0 else 0.0
    duty = curve.base_pct + curve.kp * err + curve.ki * integral + curve.kd * deriv
    if not math.isfinite(duty):  # an overflowing term: full duty, the state kept
        return 100.0, st
    return min(max(duty, 0.0), 100.0), CurveState(integral=integral, prev_err=err, t=now)


def pid_pinned(curve: PidCurve, st: CurveState) -> bool:
    """Whether the PID left at ``st`` gives the same duty and state (but its time) for the same temperature
    after any time step: no error, or the integral at its anti-windup bound with the error pushing against
    it (the derivative is zero: the error does not change)."""
    err = st.prev_err
    if err is None:
        return False
    if err == 0.0:
        return True
    if not curve.ki:
        return False
    lo, hi = sorted(((0.0 - curve.base_pct) / curve.ki, (100.0 - curve.base_pct) / curve.ki))
    return (st.integral == lo and err < 0.0) or (st.integral == hi and err > 0.0)


def evaluate(name: str, curve: PointsCurve | PidCurve | MixCurve, curves: Mapping[str, object],
             temps: Mapping[str, float], now: float, states: Mapping[str, CurveState],
             out_states: dict[str, CurveState], depth: int = 0) -> float | None:
    """Duty (%) of ``curve`` (named ``name`` for its state), or None when a source temperature is unknown.

    ``temps``: curve name → its source temperature (°C) this tick; ``states``/``out_states``: curve state by
    name, previous and next."""
    if depth > 32:
        return None
    if isinstance(curve, MixCurve):
        parts = []
        for ref in curve.curves:
            sub = curves.get(ref)
            if sub is None:
                return None
            v = evaluate(ref, sub, curves, temps, now, states, out_states, depth + 1)  # type: ignore[arg-type]
            if v is None:
                return None
            parts.append(v)
        if curve.fn == "max":
            return max(parts)
        if curve.fn == "min":
            return min(parts)
        return sum(parts) / len(parts)
    temp = temps.get(name)
    if temp is None:
        return None
    st = states.get(name)
    if st is None:
        st = _FRESH
    if isinstance(curve, PointsCurve):
        duty, new = points_step(curve, temp, st)
    else:
        duty, new = pid_step(curve, temp, now, st)
    out_states[name] = new
    return duty


def shape(duty: float, temp_c: float | None, now: float, prev: FanState, *, min_duty_pct: float = 0.0,
          start_duty_pct: float | None = None, stop_below_c: float | None = None,
          ramp_up_pct_s: float | None = None, ramp_down_pct_s: float | None = None,
          stop_pct: float | None = None, stop_hysteresis_pct: float = 0.0) -> float:
    """The duty (%) to send: 0 below ``stop_below_c``, else at least ``min_duty_pct``; a fan starting from 0
    gets at least ``start_duty_pct`` (kick, ramp-free); changes limited to the ramp rates since ``prev``.
    ``stop_pct`` (a fan allowed to stop, ``min_duty_pct`` 0, whose lowest running duty is known): while it
    turns, a duty under ``stop_pct`` holds it at ``stop_pct`` until the duty falls ``stop_hysteresis_pct``
    below, then 0; while it is still, it starts only at ``stop_pct`` or above."""
    last = prev.duty_pct
    if stop_below_c is not None and temp_c is not None and temp_c < stop_below_c:
        target = 0.0
    else:
        target = max(duty, min_duty_pct)
        if target <= 0.0 and stop_below_c is None and min_duty_pct > 0:
            target = min_duty_pct
        if stop_pct is not None and min_duty_pct <= 0.0 and 0.0 < target < stop_pct:
            running = last is not None and last > 0.0
            target = stop_pct if running and target > stop_pct - stop_hysteresis_pct else 0.0
    target = min(max(target, 0.0), 100.0)
    if last is None:
        return target
    if target > 0.0 and last <= 0.0 and start_duty_pct is not None:
        return max(target, start_duty_pct)
    dt = now - prev.t if prev.t is not None and now > prev.t else 0.0
    if target > last and ramp_up_pct_s is not None:
        target = min(target, last + ramp_up_pct_s * dt)
    elif target < last and ramp_down_pct_s is not None:
        target = max(target, last - ramp_down_pct_s * dt)
    return target
