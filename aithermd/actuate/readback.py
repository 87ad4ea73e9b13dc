"""What a knob's read-back means: how close counts as the same setting, and what a quantised or mode-refusing
pwm knob holds once written (its backend's ``pwm_knob``: :class:`~aithermd.backends.pwm.PwmKnob`). The board
chips' backend (:mod:`~aithermd.backends.hwmon`) and the GPUs' (:mod:`~aithermd.backends.gpu_hwmon`) have
one; a fan of a backend without it gets none of these rules (attack13 A1: amdgpu's ramping read-back)."""

from __future__ import annotations

from typing import Any

from aithermd.backends.base import Backend
from aithermd.model import Decision, Knob, KnobKind, KnobValue, Layer, Status
from aithermd.policy.arbiter import CEILING_RULE
from aithermd.units import num

MANUAL_MODES = (None, "manual")
SETTLE_PCT = 5.0  # a fan read back within this of its request after a move is the driver settling (lag)


def tolerance(knob: Knob, value: float) -> float:
    """How far a read-back may differ from the request and still count as the same setting: 1 % duty
    (pwmN holds 0–255, steps of 0.39 %), else 0.5 W or 1 % of the value, whichever is larger."""
    if knob.unit == "%":
        return 1.0
    return max(0.5, abs(value) * 0.01)


def same_setting(knob: Knob, kv: KnobValue | None, value: float, *, any_mode: bool = False) -> bool:
    """True when ``kv`` (a read-back) already holds ``value`` in manual mode (or a mode-less knob; in any
    mode with ``any_mode``: a knob whose driver refuses manual mode); within :func:`tolerance`, written out
    here (asked of every knob at every tick)."""
    return (kv is not None and kv.status == Status.OK and kv.value is not None
            and (any_mode or kv.mode in MANUAL_MODES)
            and abs(kv.value - value) <= (1.0 if knob.unit == "%" else max(0.5, abs(value) * 0.01)))


def _pwm_knob(backend: Backend, knob: Knob) -> Any:
    """The backend's knob object for ``knob`` where it keeps one (hwmon's ``pwm_knob``: a
    :class:`~aithermd.backends.pwm.PwmKnob`), else None."""
    fn = getattr(backend, "pwm_knob", None)
    try:
        return fn(knob.id) if fn is not None else None
    except Exception:  # noqa: BLE001 - an unknown knob
        return None


def settles_at(backend: Backend, knob: Knob, value: float) -> float:
    """The value ``knob`` holds once ``value`` is written: a quantised pwm's driver level at or above it
    (``PwmKnob.settles_at``), else ``value``."""
    pwm = _pwm_knob(backend, knob)
    return float(pwm.settles_at(value)) if pwm is not None else value


def setting_held(backend: Backend, knob: Knob, value: float) -> tuple[float, bool]:
    """:func:`settles_at` and whether :func:`mode_refused` gives a reason, with one look-up of the backend's
    knob object (the applier asks both of every knob at every tick: :func:`_pwm_knob` written out)."""
    fn = getattr(backend, "pwm_knob", None)
    if fn is None:
        return value, False
    try:
        pwm = fn(knob.id)
    except Exception:  # noqa: BLE001 - an unknown knob
        return value, False
    if pwm is None:
        return value, False
    return float(pwm.settles_at(value)), pwm.mode_refused is not None


def mode_refused(backend: Backend, knob: Knob) -> str | None:
    """Why ``knob``'s duty is written without manual mode (``PwmKnob.mode_refused``: a driver that refuses
    ``pwmN_enable := 1``), None where it is not or the backend has no such notion."""
    pwm = _pwm_knob(backend, knob)
    return pwm.mode_refused if pwm is not None else None


def levels_of(backend: Backend, knob: Knob) -> Any:
    """What ``knob``'s driver was learnt to keep (a pwm's :class:`~aithermd.backends.pwm_levels.Levels`:
    ``lagging`` when its read-back trails the writes, the fan's ramping output), None for other knobs."""
    pwm = _pwm_knob(backend, knob)
    return pwm.levels if pwm is not None else None


def trails(levels: Any) -> bool:
    """Whether a pwm's read-back trails its writes (``levels``: :func:`levels_of`, ``Levels.lagging``)."""
    return levels is not None and levels.lagging


def settling(after: float, now: float, requested: float, levels: Any) -> bool:
    """Whether a fan's read-back moving from ``after`` to ``now`` (%) is its driver settling on ``requested``:
    within :data:`SETTLE_PCT` of it, or anywhere on the way for a read-back that trails the writes."""
    return abs(now - requested) <= SETTLE_PCT or trails(levels) and (after - now) * (requested - now) <= 0


def limit_kept(knob: Knob, decision: Decision, value: float, current: KnobValue | None,
               own: Any) -> bool:
    """Whether power limit ``knob``, read back as ``current``, already holds what its driver keeps of
    ``value`` (W): at or below it for a safety cut, or what the driver kept after ``own``'s last write of
    the same value, unchanged since (writing it again would change nothing). ``own``: the applier's
    record of the knob (``after``, ``requested``), None before its first write. False for other knobs."""
    if knob.kind != KnobKind.POWER_LIMIT or current is None or current.status != Status.OK \
            or current.value is None:
        return False
    if decision.layer == Layer.SAFETY and decision.rule != CEILING_RULE \
            and current.value <= value + tolerance(knob, value):  # a cut, not the release ceiling
        return True
    return (own is not None and own.after is not None and current == own.after
            and abs(own.requested - value) <= tolerance(knob, value))


def unreadable(kv: KnobValue | None) -> bool:
    """Whether ``kv`` (a read-back) says nothing of the knob's setting: none, failed, or no value."""
    return kv is None or kv.status != Status.OK or kv.value is None


def unread_wait(knob: Knob, value: float, current: KnobValue | None, own: Any, t_wall: float | None,
                retry_s: float) -> bool:
    """Whether writing ``value`` to ``knob`` now would repeat a write of the same value that its driver
    took less than ``retry_s`` s ago (``own.taken``, wall s; ``own``: the applier's record of the knob)
    and that cannot be read back: ``current`` (this tick's read-back) still :func:`unreadable`. A wall
    clock stepped back ends the wait; no ``t_wall`` (None) waits for nothing."""
    if own is None or own.taken is None or t_wall is None or not unreadable(current):
        return False
    return abs(own.requested - value) <= tolerance(knob, value) and own.taken <= t_wall < own.taken + retry_s


def stuck(knob: Knob, own: Any, after: KnobValue, value: float) -> tuple[str, dict[str, Any]] | None:
    """The ``drift`` (message, data) to report when ``after``, read back after a write, does not hold
    ``value`` (the value the knob settles at): once per distinct case (``own.stuck``, the applier's record
    of the knob, kept here), None when it holds or the case was said already."""
    if same_setting(knob, after, value, any_mode=own.refused is not None):
        own.stuck = None
        return None
    case = (value, after.value, after.mode)
    if own.stuck == case:
        return None
    own.stuck = case
    got = "unreadable" if after.value is None else f"{num(after.value)} {knob.unit}"
    return (f"{knob.id} did not stick: asked {num(value)} {knob.unit}, read back {got}"
            + (f" in mode {after.mode}" if after.mode not in MANUAL_MODES else ""),
            {"expected": value, "got": after.value, "mode": after.mode, "why": "did_not_stick"})
