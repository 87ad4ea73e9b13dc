"""Putting a hwmon ``pwmN`` knob back as it was found, and what is done instead when that would be unsafe.

The rules (README, Fans; the product's first safety rule: a fan is never left in manual mode at a low duty):

- **The original, exactly**, when it can be written: manual → ``pwmN_enable`` 1 then the duty; automatic →
  the mode, the duty (best effort: the driver owns it then), the mode again, nothing read in between (a read
  that hangs must not leave the fan manual: restore8); no ``pwmN_enable`` → the duty.
- **A manual original at a low duty is not put back** (below :data:`LOW_DUTY_RAW`): nothing would drive
  that fan once the daemon is gone (unless the fan is handed back to the program that keeps writing it,
  :data:`TO_WRITER`). It is what the daemon finds when a fan's true original was lost — a
  journal that could not be read and was moved aside, a driver reload, a chip back under another name, a
  crash of another controller (attack6 G1, G5, G9) — and putting it back would leave the fan at that duty
  until the next reboot. The fan goes to its driver's automatic mode instead (:func:`driver_auto`), or full
  duty where none is known.
- **A saved state that does not decode** (a hand-edited or damaged journal: ``"pwm": "abc"``, a duty over
  255, a mode that is no small integer or none its driver documents, :data:`MAX_MODE`) is not written: the
  driver's automatic mode, or full duty (attack6
  G2: the error went past the full-duty fallback and left the fan manual at a low duty).
- **A write refused for a moment** (``EAGAIN``, ``EINTR``, ``EBUSY``: an SMBus or mutex busy, the codes the
  sysfs reads retry on) is tried :data:`RESTORE_TRIES` times, :data:`RETRY_PAUSE_S` apart, before the fan is
  left at full duty (attack6 G7: one busy transfer at exit left six fans at full duty for good).
- **Unknown mode or duty** (``pwmN_enable`` unreadable, a read-back found meaningless): automatic mode, else
  full duty.
- **Full duty** when the restore fails: manual 255, then ``pwmN_enable`` 0 where the driver documents it as
  full speed. Only when even that fails does the restore raise.

Each function returns None when the original is back, else a note saying what was done instead.
"""

from __future__ import annotations

import contextlib
import errno
import time
from typing import TYPE_CHECKING, Any

from aithermd import units
from aithermd.backends.base import LOW_DUTY_PCT, TO_WRITER
from aithermd.backends.sysfs import Attribute, Nonsense, errno_name, write_error
from aithermd.errors import BackendError, DeviceLost

if TYPE_CHECKING:
    from aithermd.backends.pwm import PwmKnob

MANUAL = 1
FULL = 0
LOW_DUTY_RAW = units.pct_to_pwm(LOW_DUTY_PCT)  # a manual original below it goes to automatic mode (128)
MAX_ENABLE = 15  # the largest pwmN_enable any hwmon driver documents is 7 (nct6775 SmartFan modes up to 5)
# the largest pwmN_enable each driver documents (Documentation/hwmon/<driver>.rst): nct6775 5 (SmartFan IV),
# it87 2, f71882fg 3 (thermostat), dell_smm/thinkpad/amdgpu/asus-wmi 2; a saved mode above it is no original
# of that driver (a hand-edited or planted journal: attack6 G3) and is not written
MAX_MODE: dict[str, int] = {"nct67": 5, "it87": 2, "it86": 2, "f71": 3, "dell_smm": 2, "thinkpad": 2,
                            "amdgpu": 2, "asus": 2}
RESTORE_TRIES = 3  # writes refused with a try-again errno, at most this many times each
RETRY_PAUSE_S = 0.02
_RETRY = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY})


def decoded(saved: Any) -> tuple[int | None, int | None] | str:
    """``(pwm, enable)`` of a saved state (``{"pwm": 0–255 | None, "enable": 0–15 | None}``), or why it does
    not decode (a string)."""
    if not isinstance(saved, dict):
        return f"the saved state is not a mapping ({type(saved).__name__})"
    out = []
    for key, top in (("pwm", units.PWM_MAX), ("enable", MAX_ENABLE)):
        value = saved.get(key)
        if value is None:
            out.append(None)
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            return f"saved {key} {value!r} is not an integer from 0 to {top}"
        else:
            out.append(value)
    return out[0], out[1]


def max_mode(driver: str) -> int:
    """The largest ``pwmN_enable`` ``driver`` documents (:data:`MAX_MODE`), else :data:`MAX_ENABLE`."""
    return next((v for prefix, v in MAX_MODE.items() if driver.startswith(prefix)), MAX_ENABLE)


def restore(knob: PwmKnob, saved: dict[str, Any]) -> str | None:
    """Put ``saved`` (what :meth:`PwmKnob.save` returned) back on ``knob`` by the rules of the module doc.
    Raises DeviceLost when the chip is gone from its path, BackendError when not even full duty holds."""
    kid = knob.knob.id
    try:
        got = decoded(saved)
        if isinstance(got, str):
            return automatic(knob, f"{kid}: {got}")
        pwm, enable = got
        top = max_mode(knob.driver)
        if enable is not None and enable > top:
            return automatic(knob, f"{kid}: saved enable {enable} is no mode {knob.driver or 'its driver'} "
                                   f"knows (0–{top}): not written")
        if saved.get("enable_unreadable") and knob.enable is not None:
            why = f"{kid}: the original mode could not be read ({saved['enable_unreadable']})"
            auto = saved.get("auto")
            ok = isinstance(auto, int) and not isinstance(auto, bool) and 2 <= auto <= top
            return automatic(knob, why, auto if ok else None)
        if knob.levels.blind and enable in (None, MANUAL):
            # its manual duty was read through a read-back found meaningless later (pwm_levels): 0 read back
            # would stop the fan for good
            return automatic(knob, f"{kid}: the original duty is unknown (pwm reads back nothing true)")
        if enable == MANUAL and knob.enable is not None and (pwm is None or pwm < LOW_DUTY_RAW) \
                and not saved.get(TO_WRITER):
            return automatic(knob, f"{kid}: found in manual mode at {units.pwm_to_pct(pwm or 0):.0f} % (pwm "
                                   f"{pwm}), which nothing would drive once the daemon is gone")
        _exact(knob, pwm, enable)
    except DeviceLost as lost:
        # not at this path any more (a reload renumbered the chip: the caller looks it up again), or a driver
        # that answered ENODEV once: the duty may already be written (an automatic original's duty goes
        # first), so full duty if the chip still takes it (attack7 H3: five fans left manual at 0–44 %)
        try:
            return full(knob, f"{kid}: restoring the original failed ({lost})")
        except BackendError:
            raise lost from None
    except BackendError as exc:
        return full(knob, f"{kid}: restoring the original failed ({exc})")
    return None


def automatic(knob: PwmKnob, why: str, auto: int | None = None) -> str:
    """Hand ``knob`` to its driver's automatic mode (``auto``, else the driver's documented one), or full duty
    where none is known; the note."""
    from aithermd.backends.pwm import driver_auto
    auto = auto if auto is not None else driver_auto(knob.driver)
    if knob.enable is None or auto is None:
        return full(knob, f"{why}; no automatic mode is known for {knob.driver or 'this driver'}")
    try:
        _write(knob.enable, auto, f"{knob.knob.id}: enable {auto}")
    except BackendError as exc:
        return full(knob, f"{why}; the driver's automatic mode was refused ({exc})")
    return f"{why}: handed to the driver's automatic mode (enable {auto})"


def _exact(knob: PwmKnob, pwm: int | None, enable: int | None) -> None:
    kid = knob.knob.id
    if enable is None or enable == MANUAL or knob.enable is None:
        if enable == MANUAL and knob.enable is not None:
            _write(knob.enable, MANUAL, f"{kid}: restore enable 1")
        if pwm is not None:
            _write(knob.pwm, pwm, f"{kid}: restore pwm {pwm}")
        return
    # an automatic original: the mode first (the safe state, the firmware in charge), so that a write or read
    # that hangs after it cannot leave the fan manual at the daemon's duty; then the duty, best effort (the
    # driver owns it); then the mode once more (a driver that takes a duty written in automatic mode as
    # manual control). Nothing is read unless the mode is refused (restore8: a hung read of pwmN_enable
    # between the duty and the mode left the fan manual at duty 0)
    with contextlib.suppress(OSError):
        _retried(knob.enable, enable)
    if pwm is not None:
        with contextlib.suppress(OSError):
            knob.pwm.write_int(pwm)
    try:
        _retried(knob.enable, enable)
    except OSError as exc:
        with contextlib.suppress(OSError, Nonsense):
            if knob._enable() == enable:
                return  # the mode is as found (a driver that refuses the write of its own mode)
        raise write_error(exc, f"{kid}: restore enable {enable}") from exc


def full(knob: PwmKnob, why: str) -> str:
    """Full duty after a failed restore: manual 255, else ``pwmN_enable`` 0 where it means full speed.
    Returns the note; raises BackendError when neither holds."""
    from aithermd.backends.pwm import FULL_ON_ZERO
    errors = []
    if knob.enable is not None:
        try:
            _retried(knob.enable, MANUAL)
        except OSError as exc:
            errors.append(f"enable := 1: {errno_name(exc.errno)}")
    try:
        _retried(knob.pwm, units.PWM_MAX)
        return f"{why}: left at full duty (pwm 255) instead"
    except OSError as exc:
        errors.append(f"pwm := 255: {errno_name(exc.errno)}")
    if knob.enable is not None and knob.driver.startswith(FULL_ON_ZERO):
        try:
            _retried(knob.enable, FULL)
            return f"{why}: left at full speed (enable 0) instead"
        except OSError as exc:
            errors.append(f"enable := 0: {errno_name(exc.errno)}")
    raise BackendError(f"{why}; full duty failed too ({'; '.join(errors)}): the fan may be left as it is")


def _retried(attr: Attribute, value: int) -> None:
    """``attr.write_int(value)``, again after a try-again errno (:data:`RESTORE_TRIES` in all); raises
    OSError."""
    for attempt in range(RESTORE_TRIES):
        try:
            attr.write_int(value)
            return
        except OSError as exc:
            if exc.errno not in _RETRY or attempt == RESTORE_TRIES - 1:
                raise
            time.sleep(RETRY_PAUSE_S)


def _write(attr: Attribute, value: int, what: str) -> None:
    try:
        _retried(attr, value)
    except OSError as exc:
        raise write_error(exc, what) from exc
