"""Exception tree shared by every layer.

Absence is not failure: :class:`NotSupported` is a capability decided at discovery, :class:`NoPermission`
makes a knob read-only, :class:`DeviceLost` and I/O errors are health problems that drive the failsafe.
"""

from __future__ import annotations

# Exit status of `aithermd run` for a configuration it cannot start with (an invalid settings or policy file,
# a missing active policy, a sysfs root or state directory it cannot use): EX_CONFIG of sysexits.h. The unit's
# RestartPreventExitStatus= names it, so systemd does not restart into the same error; fix the file and start
# the service again.
EXIT_CONFIG = 78


class AithermError(Exception):
    """Base of every error aithermd raises on purpose."""


class BackendError(AithermError):
    """A hardware backend could not do what was asked."""


class NotSupported(BackendError):
    """The device has no such capability (NVML_ERROR_NOT_SUPPORTED, a missing sysfs attribute)."""


class NoPermission(BackendError):
    """The capability exists but this process may not use it (NVML_ERROR_NO_PERMISSION, EACCES)."""


class DeviceLost(BackendError):
    """The device fell off the bus or vanished (NVML_ERROR_GPU_IS_LOST, ENODEV)."""


class BackendTimeout(BackendError):
    """A read or write did not finish within its deadline."""


class OutOfRange(BackendError):
    """A value outside the knob's own constraints (NVML_ERROR_INVALID_ARGUMENT, EINVAL)."""


class RefusedOriginal(BackendError):
    """A journaled original that is not written: outside the knob's constraints or the driver's modes, or on
    a path the daemon must not write (attack6 G3). The message says which and why, in full."""


class PolicyError(AithermError):
    """A policy or config file is invalid.

    Attributes: ``path`` (str), ``line`` and ``col`` (1-based, or None), ``key`` (dotted path in the
    document, or None), ``message`` and ``hint`` (None or a suggestion such as "did you mean 'sustain_s'?").
    ``str()`` gives ``FILE:LINE:COL: error: KEY: message (hint: ...)``.
    """

    def __init__(self, path: str, message: str, *, line: int | None = None, col: int | None = None,
                 key: str | None = None, hint: str | None = None) -> None:
        self.path, self.message, self.line, self.col, self.key, self.hint = path, message, line, col, key, hint
        super().__init__(self.format())

    def format(self, severity: str = "error") -> str:
        """``FILE:LINE:COL: error: KEY: message (hint: ...)``; ``severity`` ``warning`` for what is only
        worth saying (``aithermd check``'s device warnings)."""
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        text = f"{where}: {severity}: "
        if self.key:
            text += f"{self.key}: "
        text += self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        return text


class PolicyErrors(AithermError):
    """Several :class:`PolicyError`, all reported at once; ``errors`` is the list."""

    def __init__(self, errors: list[PolicyError]) -> None:
        self.errors = errors
        super().__init__("\n".join(e.format() for e in errors))


class UnknownKnob(AithermError):
    """No knob with that id (D-Bus ``io.github.aithermd.Error.UnknownKnob``)."""


class UnknownPolicy(AithermError):
    """No policy with that name (D-Bus ``io.github.aithermd.Error.UnknownPolicy``)."""


class UnknownCookie(AithermError):
    """No hold with that cookie (D-Bus ``io.github.aithermd.Error.UnknownCookie``)."""


class StateNotSaved(AithermError):
    """A change meant to survive a restart could not be written to the state directory; it was not made
    (D-Bus ``io.github.aithermd.Error.StateNotSaved``)."""


class LimitExceeded(AithermError):
    """The caller already has as many holds as one may (D-Bus ``io.github.aithermd.Error.LimitExceeded``)."""


class Busy(AithermError):
    """Not now: the thing asked for is held by something that must finish first (a safety decision on a
    GPU's knobs, too many of the caller's own requests in flight)
    (D-Bus ``io.github.aithermd.Error.Busy``)."""


class InvalidArgument(AithermError):
    """An argument out of range or malformed (D-Bus ``OutOfRange`` / ``InvalidArgument``)."""
