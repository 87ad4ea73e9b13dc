"""What is put right when the journal's originals are lost (a torn journal moved aside: attack6 G1).

The crash that tore the journal may have left any knob at the daemon's last value, and the next daemon's
first write journals whatever it finds as the "original": a value left behind by a crash then comes back at
every stop for good (attack7 H7: a GPU power limit cut to its minimum by a critical temperature). With no
trustworthy original, :func:`make_safe` puts back what the device itself calls its default, in the safe
direction only, and says so in one warning line per knob:

- **fans** (hwmon ``pwmN``, NVML fans, amdgpu ``fan0``): by the restore's rules, a fan found in manual mode
  at a low duty goes to its driver's automatic mode (:data:`~aithermd.backends.base.LOW_DUTY_PCT`); the
  others keep what they have;
- **GPU power limits** (NVML ``power_limit``, whose default is ``nvmlDeviceGetPowerManagementDefaultLimit``;
  amdgpu ``power1_cap``, default ``power1_cap_default``) found *below* the device's default limit are set to
  it (a limit raised above it by an admin is kept: it is no crash's leftover cut);
- **locked SM clocks** (NVML): NVML cannot read a lock back, so any lock is reset
  (``nvmlDeviceResetGpuLockedClocks``): the driver's own boost, as at boot;
- CPU limits (RAPL PL1/PL2), EPP, governors and target temperatures are left as found: the firmware's own
  value is not known for them, and a crash's leftover there never heats anything.

Used by the daemon's start (:func:`aithermd.actuate.restore.restore_at_start`) and ``aithermd restore``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from aithermd.backends.base import Backend
from aithermd.model import Knob, KnobKind

LIMIT_SLACK_W = 0.5  # a limit within this of its default is at the default (mW and whole-W rounding)


def _say(method: Callable[..., Any], event: str, **fields: Any) -> None:
    try:
        method(event, **fields)
    except Exception:  # noqa: BLE001 - a failing log sink never stops making the hardware safe
        pass


def _fan(backend: Backend, knob: Knob) -> str | None:
    note = backend.restore_knob(knob.id, backend.save_knob(knob.id))
    return note if isinstance(note, str) else None


def _limit(backend: Backend, knob: Knob) -> str | None:
    if knob.default is None:
        return None
    found = backend.read_knob(knob.id).value
    if found is None or found >= knob.default - LIMIT_SLACK_W:
        return None
    to = knob.clamp(knob.default)
    backend.write_knob(knob.id, to)
    return (f"{knob.id}: found at {found:g} W, below the device's default limit {knob.default:g} W, and its "
            f"original is lost with the journal (a crash may have left a cut there): set to the default "
            f"{to:g} W")


def _clock_lock(backend: Backend, knob: Knob) -> str | None:
    if knob.max is None:
        return None
    backend.write_knob(knob.id, knob.max)  # the card's top: the lock is reset
    return (f"{knob.id}: its original is lost with the journal and NVML cannot read a lock back: any SM "
            "clock lock a crash left is reset (the driver's own boost)")


_DO: Mapping[KnobKind, Callable[[Backend, Knob], str | None]] = {
    KnobKind.PWM: _fan, KnobKind.FAN: _fan, KnobKind.POWER_LIMIT: _limit, KnobKind.SM_CLOCK_LOCK: _clock_lock}


def make_safe(owner: Mapping[str, Backend], knobs: Iterable[Knob]) -> dict[str, str]:
    """After the originals were lost (:attr:`~aithermd.actuate.journal.Journal.lost`): every writable fan,
    GPU power limit and SM clock lock in ``knobs`` put right by the rules of the module doc. ``owner``: knob
    id → its backend. Returns knob id → what was done (only the knobs changed), or why it failed (logged:
    ``made_safe`` warnings, ``unsafe`` errors). Never raises for one knob."""
    log = structlog.get_logger("aithermd.restore")
    done: dict[str, str] = {}
    for knob in knobs:
        do = _DO.get(knob.kind)
        if do is None or not knob.writable or knob.id not in owner:
            continue
        try:
            note = do(owner[knob.id], knob)
        except Exception as exc:  # noqa: BLE001 - said, and the others are still made safe
            done[knob.id] = f"{knob.id}: cannot be made safe: {type(exc).__name__}: {exc}"
            _say(log.error, "unsafe", knob=knob.id, message=done[knob.id])
            continue
        if note is not None:
            done[knob.id] = note
            _say(log.warning, "made_safe", knob=knob.id, message=note)
    return done
