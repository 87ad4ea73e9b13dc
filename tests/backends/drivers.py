"""Drivers as they answer writes to ``pwmN`` and ``pwmN_enable``, over a recorded tree (a :class:`FaultIO`).

Each behaviour is one a real driver has (the source is named where it is set):

- ``levels[pwm file] = fn(raw) -> raw``: the value the driver keeps of a ``pwmN`` write (dell_smm keeps one
  of 3 fan states: ``DIV_ROUND_CLOSEST(val, 128)``, shown as ``state * 128`` clamped to 255);
- ``manual_only``: ``pwmN`` files whose writes fail with EINVAL unless ``pwmN_enable`` reads 1 (amdgpu's
  ``amdgpu_hwmon_set_pwm1``: "manual fan speed control should be enabled first"; gpd_fan answers EPERM);
- ``enable_after_duty``: ``pwmN_enable`` files that refuse 1 (EINVAL) until the duty has been written;
- ``enable_ignored[enable file] = value``: a mode write that is accepted and not kept (firmware holding
  control: the file reads ``value`` again);
- ``full_reads_zero``: it87's ``pwm_mode()``, which reports ``pwmN_enable`` 0 for a manual fan at 255.
- ``ramp[pwm file] = raw per second``: ``pwmN`` reads the fan's output, which moves toward the last write at
  that rate as :meth:`DriverIO.advance` lets time pass (a chip whose ``pwmN`` register gives its current
  output, moving in steps; the case ``readback.SETTLE_PCT`` allows for; attack3 N6 found the round-up
  taking each lagging read for a level).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from .faults import FaultIO


def dell_smm_level(raw: int) -> int:
    """dell_smm (3 fan states on most machines, ``i8k_pwm_mult`` 128): what ``pwmN`` reads after ``raw``."""
    state = min(2, max(0, (raw + 64) // 128))
    return min(255, state * 128)


class DriverIO(FaultIO):
    def __init__(self) -> None:
        super().__init__()
        self.levels: dict[str, Callable[[int], int]] = {}
        self.manual_only: set[str] = set()
        self.enable_after_duty: set[str] = set()
        self.enable_ignored: dict[str, int] = {}
        self.full_reads_zero: set[str] = set()
        self.ramp: dict[str, float] = {}
        self._ramping: dict[str, list[float]] = {}  # path: [output, target]
        self._dutied: set[str] = set()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass for the ramping ``pwmN`` files: each output moves toward its last write."""
        for path, (out, target) in self._ramping.items():
            rate = self.ramp[self._match(self.ramp, path)]
            out = min(target, out + rate * seconds) if target > out else max(target, out - rate * seconds)
            self._ramping[path][0] = out
            _put(path, int(out))

    @staticmethod
    def _match(names, path: str):
        return next((n for n in names if path.endswith("/" + n)), None)

    def write(self, path: str, data: bytes) -> None:
        name = path.rsplit("/", 1)[1]
        for suffix, exc in self.write_faults.items():
            if path.endswith(suffix):
                raise exc
        if name.endswith("_enable"):
            pwm_path = path[: -len("_enable")]
            if name in self.enable_after_duty and pwm_path not in self._dutied and data.strip() == b"1":
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            self.writes.append((path, data))
            value = int(data)
            if name in self.enable_ignored and value == 1:
                value = self.enable_ignored[name]
            if name in self.full_reads_zero and value == 1 and _read_int(pwm_path) == 255:
                value = 0
            _put(path, value)
            return
        enable_path = path + "_enable"
        if name in self.manual_only and _read_int(enable_path) not in (1, 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        self.writes.append((path, data))
        raw = int(data)
        level = self._match(self.levels, path)
        if self._match(self.ramp, path):
            self._ramping.setdefault(path, [float(_read_int(path) or 0), 0.0])[1] = float(raw)
        else:
            _put(path, self.levels[level](raw) if level else raw)
        self._dutied.add(path)
        if name + "_enable" in self.full_reads_zero and os.path.exists(enable_path):
            mode = _read_int(enable_path)
            if raw == 255 and mode == 1:
                _put(enable_path, 0)
            elif raw != 255 and mode == 0:
                _put(enable_path, 1)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _put(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")
