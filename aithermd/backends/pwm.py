"""One hwmon ``pwmN`` knob: read, write (manual mode first), save and restore.

Kernel hwmon sysfs ABI (Documentation/hwmon/sysfs-interface.rst): ``pwmN`` is the duty 0–255;
``pwmN_enable`` is 0 (no control: full speed), 1 (manual) or ≥2 (automatic, driver- or chip-controlled);
some drivers (dell_smm, amdgpu on RDNA4) have no ``pwmN_enable``. Values leave here in % (0–100).
"""

from __future__ import annotations

import errno
import math
from typing import Any

from aithermd import units
from aithermd.backends.fast import ok_knob
from aithermd.backends.sysfs import Attribute, Nonsense, classify_oserror, write_error
from aithermd.errors import BackendError, OutOfRange
from aithermd.model import Knob, KnobValue, Status

MANUAL = 1
_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP)  # the driver has pwmN_enable but will not take 1
_MODES = {0: "full", MANUAL: "manual"}


def pwm_mode(enable: int | None) -> str | None:
    """``pwmN_enable`` → ``"full"`` (0), ``"manual"`` (1), ``"auto"`` (≥2), None without the file."""
    if enable is None:
        return None
    return _MODES.get(enable, "auto")



class PwmKnob:
    """``knob`` (its description) over the ``pwm`` attribute and the optional ``enable`` attribute."""

    __slots__ = ("knob", "pwm", "enable")

    def __init__(self, knob: Knob, pwm: Attribute, enable: Attribute | None) -> None:
        self.knob, self.pwm, self.enable = knob, pwm, enable

    def read(self) -> KnobValue:
        """Duty % and mode as read now; a failed or nonsense read gives a status, never an exception."""
        try:
            raw = self.pwm.read_int()
            enable = self.enable.read_int() if self.enable is not None else None
        except OSError as exc:
            return KnobValue(self.knob.id, None, None, classify_oserror(exc)[0])
        except Nonsense:
            return KnobValue(self.knob.id, None, None, Status.IMPLAUSIBLE)
        if not 0 <= raw <= units.PWM_MAX:
            return KnobValue(self.knob.id, None, pwm_mode(enable), Status.IMPLAUSIBLE)
        return ok_knob(self.knob.id, units.pwm_to_pct(raw), pwm_mode(enable))

    def write(self, duty_pct: float) -> None:
        """``pwmN_enable`` := 1 when it is not already, then ``pwmN`` := the duty. A driver that refuses
        manual mode (EINVAL, EOPNOTSUPP on ``pwmN_enable``) still gets the duty: the caller's read-back
        tells whether it holds (drift). Raises OutOfRange (outside 0–100 % or EINVAL on ``pwmN``),
        NoPermission, DeviceLost or BackendError."""
        kid = self.knob.id
        if math.isnan(duty_pct) or not 0.0 <= duty_pct <= 100.0:
            raise OutOfRange(f"{kid}: duty {duty_pct} % outside 0–100 %")
        if self.enable is not None:
            try:
                current = self.enable.read_int()
            except (OSError, Nonsense):
                current = None
            if current != MANUAL:
                try:
                    self.enable.write_int(MANUAL)
                except OSError as exc:
                    if exc.errno not in _REFUSED:
                        raise write_error(exc, f"{kid}: set manual mode (enable := 1)") from exc
        self._write(self.pwm, units.pct_to_pwm(duty_pct), f"{kid} := {duty_pct:g} %")

    def save(self) -> dict[str, Any]:
        """``{"pwm": 0–255, "enable": int | None}`` as found (raw hwmon units)."""
        try:
            raw = self.pwm.read_int()
            enable = self.enable.read_int() if self.enable is not None else None
        except OSError as exc:
            raise write_error(exc, f"{self.knob.id}: cannot read the original") from exc
        except Nonsense as exc:
            raise BackendError(f"{self.knob.id}: cannot read the original: {exc}") from exc
        return {"pwm": raw, "enable": enable}

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back what :meth:`save` returned: manual → enable then pwm; automatic → pwm (best effort: the
        driver owns it in automatic mode) then enable; no enable file → pwm."""
        kid = self.knob.id
        enable, pwm = saved.get("enable"), saved.get("pwm")
        if enable is None or enable == MANUAL or self.enable is None:
            if enable == MANUAL and self.enable is not None:
                self._write(self.enable, MANUAL, f"{kid}: restore enable 1")
            if pwm is not None:
                self._write(self.pwm, int(pwm), f"{kid}: restore pwm {pwm}")
            return
        if pwm is not None:
            try:
                self.pwm.write_int(int(pwm))
            except OSError:
                pass
        self._write(self.enable, int(enable), f"{kid}: restore enable {enable}")

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
