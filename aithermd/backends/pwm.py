"""One hwmon ``pwmN`` knob as drivers really behave: read, write, save and restore, with fallbacks.

Kernel hwmon sysfs ABI (Documentation/hwmon/sysfs-interface.rst): ``pwmN`` is the duty 0–255;
``pwmN_enable`` is 0 (no control: full speed), 1 (manual) or ≥2 (automatic, driver- or chip-controlled);
some drivers (dell_smm on most machines, amdgpu on RDNA4) have no ``pwmN_enable``. Values leave here in %.

What real drivers do, and what this module does about it:

- **Write order.** Most drivers take ``pwmN_enable := 1`` then the duty (*mode first*). Some take the duty
  only in manual mode and refuse it before (amdgpu and gpd_fan answer EINVAL/EPERM on ``pwmN`` in automatic
  mode); some refuse the mode write (thinkpad_acpi EINVAL/EPERM on an unsupported mode, dell_smm ENODEV off
  its whitelist). When the mode write is refused the knob falls back to *duty first* (duty, mode, duty
  again) and then to *duty only*; the order that worked is kept. When neither the mode nor the duty can be
  written the knob raises :class:`Uncontrollable` (the applier raises the alarm).
- **Quantised duty, and a read-back that means nothing.** :class:`~aithermd.backends.pwm_levels.Levels` learns
  write → read-back pairs; a read-back below the duty asked is written again one level up, so a fan never
  gets less cooling than asked (round up), and :meth:`PwmKnob.settles_at` tells the applier which duty the
  knob will hold (no false drift). A read-back that does not follow the writes is found and then ignored:
  the duty written is the duty reported (said once, ``pwm_readback_ignored``).
- **Mode read-back.** it87 reports ``pwmN_enable`` 0 (full speed) for a manual fan at 255; a mode that
  reads back 0 with the duty at 255 is the same setting. A mode write that reads back as automatic did
  not take (firmware kept control): the next order is tried.
- **Unreadable ``pwmN_enable``** (dell_smm's is write-only: kernfs answers EACCES to every read, root
  included). Control goes on; the saved original says so, and restore hands the fan to the driver's
  automatic mode (:data:`AUTO_ENABLE`) or, for a driver whose automatic value is not known, full duty.
- **A duty refused in manual mode** (an EC-owned header: EPERM; an SMBus busy for good: EBUSY) would leave the
  fan in manual mode at a stale duty. Refused outright, or :data:`DUTY_FAILURES` times in a row, the fan is
  handed back: full duty asked on a driver whose ``pwmN_enable`` 0 is full speed gets that, anything else the
  mode the fan was found in (or the driver's automatic one), with :class:`Uncontrollable` (alarm, journaled).
- **Restore never leaves a fan in manual mode at a low duty** (:mod:`aithermd.backends.pwm_restore`): a
  manual original at a low duty, or one that does not decode, goes to the driver's automatic mode; a restore
  that fails ends at full duty (manual, 255; then ``pwmN_enable`` 0 for drivers whose 0 documents full
  speed) and returns a note that says so; only when even that fails does it raise.
"""

from __future__ import annotations

import errno
import math
from typing import Any

from aithermd import units
from aithermd.backends import pwm_restore
from aithermd.backends.fast import ok_knob
from aithermd.backends.pwm_levels import Levels, say_blind
from aithermd.backends.pwm_restore import FULL, MANUAL
from aithermd.backends.sysfs import Attribute, Nonsense, classify_oserror, errno_name, write_error
from aithermd.errors import BackendError, DeviceLost, NoPermission, OutOfRange
from aithermd.model import Knob, KnobValue, Status

# errnos by which a driver refuses a pwmN_enable value (not a lost device: the duty write then tells)
_REFUSED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.ENODEV, errno.ENOSYS,
                      errno.EBUSY})
_MODES = {FULL: "full", MANUAL: "manual"}
MODE_FIRST, DUTY_FIRST, DUTY_ONLY = "mode-first", "duty-first", "duty-only"
DUTY_FAILURES = 3  # failed duty writes in manual mode in a row (EBUSY, EIO, ...): the fan is handed back

# The pwmN_enable value that hands a fan back to the chip or firmware, by driver (each driver's
# Documentation/hwmon/<driver>.rst): nct6775 family 5 (SmartFan IV, the mode boards ship in), it87, f71882fg,
# w83627ehf, dell_smm (BIOS control), thinkpad (EC auto), amdgpu, asus-wmi and gpd_fan 2.
AUTO_ENABLE: dict[str, int] = {"nct67": 5, "it87": 2, "it86": 2, "f71": 2, "w836": 2, "dell_smm": 2,
                               "thinkpad": 2, "amdgpu": 2, "asus": 2, "gpd_fan": 2}
# Drivers whose pwmN_enable 0 runs the fan at full speed: documented by the kernel's hwmon driver docs, and
# for amdgpu by its code only (smu7, vega10/20, SMU11/13; vega12 ignores it: amd13), so it is a last
# fallback, after manual 255. pwm-fan's 0 switches the fan off: never assumed.
FULL_ON_ZERO = ("nct67", "it87", "it86", "f71", "w836", "thinkpad", "amdgpu", "asus")


def pwm_mode(enable: int | None) -> str | None:
    """``pwmN_enable`` → ``"full"`` (0), ``"manual"`` (1), ``"auto"`` (≥2), None without the file."""
    if enable is None:
        return None
    return _MODES.get(enable, "auto")


def driver_auto(driver: str) -> int | None:
    """The automatic ``pwmN_enable`` value of ``driver`` (hwmon ``name``), None when not documented here."""
    return next((v for prefix, v in AUTO_ENABLE.items() if driver.startswith(prefix)), None)


def pct_to_pwm_up(duty_pct: float) -> int:
    """Duty % → the smallest ``pwmN`` (0–255) that gives at least that duty: 8 % is 21 (8.2 %), not 20."""
    return max(0, min(units.PWM_MAX, math.ceil(duty_pct * units.PWM_MAX / 100.0 - 1e-6)))


class Uncontrollable(BackendError):
    """Neither the mode nor the duty of a fan can be written: the fan is not under control."""


class PwmKnob:
    """``knob`` (its description) over the ``pwm`` attribute and the optional ``enable`` attribute of a chip
    whose driver is ``driver`` (the hwmon ``name``)."""

    __slots__ = ("knob", "pwm", "enable", "driver", "order", "levels", "enable_unreadable", "manual_seen",
                 "refusal", "found_mode", "duty_failures", "full_fallback")

    def __init__(self, knob: Knob, pwm: Attribute, enable: Attribute | None, driver: str = "") -> None:
        self.knob, self.pwm, self.enable, self.driver = knob, pwm, enable, driver
        self.order = MODE_FIRST if enable is not None else DUTY_ONLY
        self.levels = Levels()
        self.enable_unreadable: str | None = None  # why pwmN_enable cannot be read (EACCES: write-only)
        self.manual_seen = False  # manual mode was written and held (or is assumed, the file unreadable)
        self.refusal: str | None = None  # why the mode write is refused, while it is
        self.found_mode: int | None = None  # pwmN_enable before our first manual-mode write
        self.duty_failures = 0  # failed duty writes in manual mode in a row
        self.full_fallback = False  # a request for full duty is held by pwmN_enable 0 (the duty refused)

    # -- reading -----------------------------------------------------------------------------------------
    def _enable(self) -> int | None:
        """``pwmN_enable`` now; None without the file or while it cannot be read (remembered, once)."""
        if self.enable is None or self.enable_unreadable is not None:
            return None
        try:
            return self.enable.read_int()
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EIO, errno.ENODATA):
                raise
            self.enable_unreadable = errno_name(exc.errno)
            return None

    def read(self) -> KnobValue:
        """Duty % and mode as read now; a failed or nonsense read gives a status, never an exception. An
        unreadable ``pwmN_enable`` reads as mode None (manual once we wrote it, as for drivers without one);
        ``pwmN_enable`` 0 at duty 255 reads as manual 100 % (it87 shows a manual fan at full that way)."""
        try:
            raw = self.pwm.read_int()
            enable = self._enable()
        except OSError as exc:
            return KnobValue(self.knob.id, None, None, classify_oserror(exc)[0])
        except Nonsense:
            return KnobValue(self.knob.id, None, None, Status.IMPLAUSIBLE)
        if not 0 <= raw <= units.PWM_MAX:
            return KnobValue(self.knob.id, None, pwm_mode(enable), Status.IMPLAUSIBLE)
        mode = pwm_mode(enable)
        if self.levels.blind and self.levels.written is not None:
            if raw != self.levels.constant:
                self.levels.unblind()  # it moves again: believed again
            else:
                raw = self.levels.written  # the read-back means nothing (pwm_levels): what was written
        elif mode in ("manual", None) and self.levels.settle(raw):  # lag, or a level that stayed put
            say_blind(self.knob.id, raw)
            raw = self.levels.written
        if mode == "full" and self.full_fallback:
            return ok_knob(self.knob.id, 100.0, "manual")  # full speed, as asked, the duty refused
        if mode == "full" and raw == units.PWM_MAX and self.manual_seen:
            mode = "manual"
        return ok_knob(self.knob.id, units.pwm_to_pct(raw), mode)

    @property
    def mode_refused(self) -> str | None:
        """Why the duty is written without manual mode (the driver refused ``pwmN_enable := 1``, or kept
        its own mode: order duty-only), None while manual mode takes or the knob has no mode."""
        if self.enable is None or self.order != DUTY_ONLY:
            return None
        return self.refusal

    def settles_at(self, duty_pct: float) -> float:
        """The duty (%) this knob holds when ``duty_pct`` is written: the driver's level at or above it.
        (:func:`pct_to_pwm_up`, :meth:`Levels.holds` and :func:`~aithermd.units.pwm_to_pct` written out: the
        applier asks this of every pwm knob at every tick, and each was a Python call.)"""
        raw = max(0, min(units.PWM_MAX, math.ceil(duty_pct * units.PWM_MAX / 100.0 - 1e-6)))
        levels = self.levels
        if levels.quantised:
            raw = levels.holds(raw)
        return max(0.0, min(100.0, raw * 100.0 / units.PWM_MAX))

    # -- writing -----------------------------------------------------------------------------------------
    def write(self, duty_pct: float) -> None:
        """Bring the fan to at least ``duty_pct`` % in manual mode, by the write order that works (see the
        module doc). Raises OutOfRange (outside 0–100 %, or the driver refuses the duty itself),
        Uncontrollable (neither mode nor duty can be written), NoPermission, DeviceLost or BackendError."""
        kid = self.knob.id
        if math.isnan(duty_pct) or not 0.0 <= duty_pct <= 100.0:
            raise OutOfRange(f"{kid}: duty {duty_pct} % outside 0–100 %")
        target = pct_to_pwm_up(duty_pct)
        if self.order == MODE_FIRST:
            if self._manual():
                self._duty_in_manual(target)
                return
            self.order = DUTY_FIRST
        if self.order == DUTY_FIRST:
            refused = self._try_duty(target)
            if self._manual():
                self._duty(target, manual=True)
                return
            if refused is not None:
                raise Uncontrollable(f"{kid}: the driver refuses manual mode ({self.refusal}) and the duty "
                                     f"outside it ({refused}): this fan cannot be controlled")
            self.order = DUTY_ONLY  # the duty is written; the driver's own mode may still override it
            return
        self._duty(target, manual=self.enable is None)

    def _manual(self) -> bool:
        """Put ``pwmN_enable`` to 1 unless it is (or is taken to be) there already; False when refused."""
        if self.enable is None:
            return True
        try:
            current = self._enable()
        except OSError as exc:  # ENODEV: the device is gone (DeviceLost)
            raise write_error(exc, f"{self.knob.id}: read pwmN_enable") from exc
        if current == MANUAL or (current is None and self.manual_seen):
            return True
        if current == FULL and self.full_fallback:
            return True  # held at full speed by enable 0: the duty write below decides
        if self.found_mode is None:
            self.found_mode = current
        try:
            self.enable.write_int(MANUAL)
        except OSError as exc:
            if exc.errno not in _REFUSED:
                raise write_error(exc, f"{self.knob.id}: set manual mode (enable := 1)") from exc
            self.refusal = f"{errno_name(exc.errno)} on {self.knob.id.rsplit('/', 1)[1]}_enable := 1"
            return False
        try:
            after = self._enable()
        except OSError as exc:
            raise write_error(exc, f"{self.knob.id}: read pwmN_enable back") from exc
        if after is not None and after not in (MANUAL, FULL):  # firmware kept control
            self.refusal = f"{self.knob.id.rsplit('/', 1)[1]}_enable reads {after} after := 1"
            return False
        self.manual_seen, self.refusal = True, None
        return True

    def _duty_in_manual(self, target: int) -> None:
        """:meth:`_duty` in manual mode; a refused duty hands the fan back (the module doc)."""
        try:
            if self.full_fallback:
                self.full_fallback = False
                self.enable.write_int(MANUAL)  # type: ignore[union-attr] - set only with an enable file
            self._duty(target, manual=True)
        except OSError as exc:  # the mode write out of the fallback
            raise write_error(exc, f"{self.knob.id}: set manual mode (enable := 1)") from exc
        except (DeviceLost, Uncontrollable):
            raise
        except BackendError as exc:  # EPERM/EACCES, EINVAL: refused outright; EBUSY, EIO: tried again first
            self.duty_failures += 1
            if not isinstance(exc, NoPermission | OutOfRange) and self.duty_failures < DUTY_FAILURES:
                raise
            self._hand_back(target, errno_name(c.errno) if isinstance(c := exc.__cause__, OSError) else str(exc))
        else:
            self.duty_failures = 0

    def _hand_back(self, target: int, why: str) -> None:
        """Full speed by ``pwmN_enable`` 0 for full duty where 0 means that (returns), else the found or
        automatic mode (raises Uncontrollable saying where the fan is left)."""
        kid, name = self.knob.id, self.knob.id.rsplit("/", 1)[1]
        if self.enable is None:
            raise Uncontrollable(f"{kid}: the driver refuses the duty ({why})")
        if target >= units.PWM_MAX and self.driver.startswith(FULL_ON_ZERO):
            try:
                self.enable.write_int(FULL)
                self.full_fallback, self.manual_seen = True, False
                return  # full speed: what was asked
            except OSError:
                pass
        back = self.found_mode if self.found_mode not in (None, MANUAL) else driver_auto(self.driver)
        if back is None:
            raise Uncontrollable(f"{kid}: the driver takes manual mode but refuses the duty ({why}), and no "
                                 f"automatic mode is known to hand {name} back to: it stays in manual mode")
        try:
            self.enable.write_int(back)
        except OSError as exc:
            raise Uncontrollable(f"{kid}: the driver refuses the duty ({why}) and {name}_enable := {back} "
                                 f"({errno_name(exc.errno)}): it stays in manual mode") from exc
        self.manual_seen = False
        raise Uncontrollable(f"{kid}: the driver takes manual mode but refuses the duty ({why}): {name} "
                             f"handed back to the driver's own control ({name}_enable {back})")

    def _try_duty(self, target: int) -> str | None:
        """Write the duty before the mode; returns why the driver refused it, None when it took it."""
        try:
            self.pwm.write_int(value := self.levels.write_for(target))
            self.levels.written = value
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EPERM, errno.EBUSY, errno.EOPNOTSUPP):
                return errno_name(exc.errno)
            raise write_error(exc, f"{self.knob.id} := {units.pwm_to_pct(target):g} %") from exc
        return None

    def _duty(self, target: int, *, manual: bool) -> None:
        """Write the duty; in manual mode read it back, learn the level and go one level up while the
        driver kept less than ``target`` (a few writes at most: no level is skipped twice)."""
        value = self.levels.write_for(target)
        for _ in range(10):
            self._write(self.pwm, value, f"{self.knob.id} := {units.pwm_to_pct(target):.4g} %")
            self.levels.written = value
            if not manual or self.levels.blind:
                return
            if self.levels.lagging:  # its read-back trails the write: learnt from samples (pwm_levels)
                self.levels.wrote(value, None)
                return
            try:
                got = self.pwm.read_int()
            except (OSError, Nonsense):
                return  # the applier's read-back reports it
            self.levels.wrote(value, got)
            if self.levels.learn(value, got):
                say_blind(self.knob.id, got)
                return
            if got >= target or value >= units.PWM_MAX or not 0 <= got <= units.PWM_MAX:
                return
            value = min(units.PWM_MAX, value + max(1, target - got))

    # -- save and restore --------------------------------------------------------------------------------
    def save(self) -> dict[str, Any]:
        """``{"pwm": 0–255, "enable": int | None}`` as found (raw hwmon units). When ``pwmN_enable`` exists
        but cannot be read, ``enable`` is None, ``enable_unreadable`` names the errno and ``auto`` the
        driver's automatic value the restore will use (None: full duty instead)."""
        try:
            raw = self.pwm.read_int()
            enable = self._enable()
        except OSError as exc:
            raise write_error(exc, f"{self.knob.id}: cannot read the original") from exc
        except Nonsense as exc:
            raise BackendError(f"{self.knob.id}: cannot read the original: {exc}") from exc
        saved: dict[str, Any] = {"pwm": raw, "enable": enable}
        if self.enable is not None and self.enable_unreadable is not None:
            saved.update(enable_unreadable=self.enable_unreadable, auto=driver_auto(self.driver))
        return saved

    def restore(self, saved: dict[str, Any]) -> str | None:
        """Put back what :meth:`save` returned, or leave the fan safe instead
        (:func:`aithermd.backends.pwm_restore.restore`: the rules). Returns None when the original is back,
        else a note saying what was done instead. Raises DeviceLost when the chip is gone from its path,
        BackendError when not even full duty could be set."""
        self.manual_seen = self.full_fallback = False
        self.duty_failures = 0
        return pwm_restore.restore(self, saved)

    def close(self) -> None:
        self.pwm.close()
        if self.enable is not None:
            self.enable.close()

    @staticmethod
    def _write(attr: Attribute, value: int, what: str) -> None:
        try:
            attr.write_int(value)
        except OSError as exc:
            raise write_error(exc, what) from exc
