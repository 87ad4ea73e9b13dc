"""The fakes the tests drive the daemon with, held to the contract of the real backends
(:mod:`tests.support.backend_contract`, checked in ``tests/backends/test_contract.py``).

:class:`FakeBackend` is an in-memory hwmon chip with fault injection, for the daemon's tests. Units as the
hwmon backend: pwm duty in % held as a raw 0–255 ``pwm`` with a ``pwmN_enable``-like mode (0 full, 1 manual,
2 auto); temperatures in °C. Like :class:`aithermd.backends.hwmon.HwmonBackend` it refuses a duty outside
0–100 % (OutOfRange), answers unknown knob ids with UnknownKnob, reports a failing read as a status (never
an exception) and a vanished chip as ``Sample.lost`` with every reading failed. ``on_write`` is called
before each write (tests check the journal there); ``rewriter`` is another fan controller: before each
sample it sets the knobs it names.

:class:`ScriptedSensor` is an nvme drive for the slow-sensor lane: one temperature whose reads take
``duration_s`` on the given clock and can be held (``gate``) like a drive that does not answer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from aithermd.backends.base import ReadOnly
from aithermd.clock import FakeClock
from aithermd.errors import BackendError, DeviceLost, OutOfRange, UnknownKnob
from aithermd.model import (
    Channel,
    Device,
    DeviceKind,
    Knob,
    KnobKind,
    KnobValue,
    Quantity,
    Reading,
    Sample,
    Status,
)
from aithermd.units import pct_to_pwm, pwm_to_pct

MODES = {0: "full", 1: "manual", 2: "auto"}
EIO = "EIO: Input/output error"
ENODEV = "ENODEV: No such device"


class FakeBackend:
    kind = "fake"

    def __init__(self, name: str = "fake", temps: int = 2, fans: int = 2, *, start_pwm: int = 100,
                 start_enable: int = 2, clock: Callable[[], float] | None = None) -> None:
        self.name = name
        self.device_id = f"fake:{name}"
        self.temps = {f"temp{i + 1}": 40.0 + i for i in range(temps)}
        self.pwm = {f"pwm{i + 1}": start_pwm for i in range(fans)}
        self.enable = {f"pwm{i + 1}": start_enable for i in range(fans)}
        self.writes: list[tuple[str, float]] = []
        self.restored: list[tuple[str, dict[str, Any]]] = []  # (knob id, saved) of each restore_knob
        self.fail_write: dict[str, BaseException] = {}
        self.fail_read: set[str] = set()  # pwm names whose reads fail (EIO)
        self.failed_temps: set[str] = set()
        self.stuck: dict[str, int] = {}  # knob → raw value it always reads (a BMC holding it)
        self.rewriter: dict[str, int] = {}  # knob → raw value another program writes before each sample
        self.enforced_w: float | None = None
        self.lost = False
        self.on_write: Callable[[str, float], None] | None = None
        self.closed = False
        self.samples = 0
        self._clock = clock or (lambda: 0.0)

    # ids
    def kid(self, name: str) -> str:
        return f"{self.device_id}/{name}"

    def fail_all_reads(self) -> None:
        """Every temperature and pwm read fails from now on (EIO)."""
        self.failed_temps = set(self.temps)
        self.fail_read = set(self.pwm)

    def discover(self) -> list[Device]:
        channels = tuple(Channel(self.kid(t), self.device_id, t, Quantity.TEMPERATURE, "°C",
                                 thresholds={"crit": 95.0}) for t in self.temps)
        knobs = tuple(Knob(self.kid(p), self.device_id, KnobKind.PWM, "%", 0.0, 100.0, None, True)
                      for p in self.pwm)
        return [Device(self.device_id, DeviceKind.HWMON, self.name, channels, knobs, chip=self.name)]

    def sample(self) -> Sample:
        self.samples += 1
        for name, raw in self.rewriter.items():
            self.pwm[name] = raw
            self.enable[name] = 1
        if self.lost:  # as hwmon: every file answers ENODEV, the chip is lost
            readings = {self.kid(t): Reading(self.kid(t), None, Status.FAILED, ENODEV) for t in self.temps}
            knobs = {self.kid(p): KnobValue(self.kid(p), None, None, Status.FAILED) for p in self.pwm}
            return Sample(self._clock(), readings, knobs, lost=frozenset({self.device_id}))
        readings = {}
        for name, value in self.temps.items():
            cid = self.kid(name)
            if name in self.failed_temps:
                readings[cid] = Reading(cid, None, Status.FAILED, EIO)
            else:
                readings[cid] = Reading(cid, value)
        knobs = {self.kid(p): self._kv(p) for p in self.pwm}
        return Sample(self._clock(), readings, knobs)

    def _name(self, knob_id: str) -> str:
        dev, _, name = knob_id.rpartition("/")
        if dev != self.device_id or name not in self.pwm:
            raise UnknownKnob(knob_id)
        return name

    def _kv(self, name: str) -> KnobValue:
        if self.lost or name in self.fail_read:
            return KnobValue(self.kid(name), None, None, Status.FAILED)
        raw = self.stuck.get(name, self.pwm[name])
        extra = {"enforced_w": self.enforced_w} if self.enforced_w is not None else {}
        return KnobValue(self.kid(name), pwm_to_pct(raw), MODES.get(self.enable[name], "auto"), extra=extra)

    def write_knob(self, knob_id: str, value: float) -> None:
        """Duty ``value`` % (0–100), manual mode first; raises OutOfRange, DeviceLost, UnknownKnob or what
        ``fail_write`` names."""
        name = self._name(knob_id)
        if math.isnan(value) or not 0.0 <= value <= 100.0:
            raise OutOfRange(f"{knob_id}: duty {value} % outside 0–100 %")
        if self.on_write:
            self.on_write(knob_id, value)
        if self.lost:
            raise DeviceLost(f"{knob_id}: ENODEV")
        if name in self.fail_write:
            raise self.fail_write[name]
        self.writes.append((knob_id, value))
        self.enable[name] = 1
        self.pwm[name] = pct_to_pwm(value)

    def read_knob(self, knob_id: str) -> KnobValue:
        """The knob as read now: a failed read is a status, never an exception (as hwmon)."""
        return self._kv(self._name(knob_id))

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        name = self._name(knob_id)
        if self.lost or name in self.fail_read:
            raise (DeviceLost if self.lost else BackendError)(f"{knob_id}: cannot read the original")
        return {"pwm": self.pwm[name], "enable": self.enable[name]}

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        self.restored.append((knob_id, dict(saved)))
        name = self._name(knob_id)
        if self.lost:
            raise DeviceLost(f"{knob_id}: restore: ENODEV")
        self.pwm[name] = int(saved["pwm"])
        self.enable[name] = int(saved["enable"])

    def locator(self) -> dict[str, Any]:
        return {"backend": "fake", "name": self.name}

    def close(self) -> None:
        self.closed = True


class ScriptedSensor(ReadOnly):
    """``hwmon:nvme-pci-0200/temp1`` at ``value`` °C with ``status``; each read takes ``duration_s`` on
    ``clock``; ``gate`` (a semaphore) holds reads until released. ``fail = True`` makes ``sample()`` raise
    EIO — beyond the contract (real backends never raise there): it checks the slow lane survives it."""

    kind = "hwmon"
    CID = "hwmon:nvme-pci-0200/temp1"

    def __init__(self, clock: FakeClock, gate: threading.Semaphore | None = None) -> None:
        self.clock, self.gate = clock, gate
        self.value, self.duration_s, self.fail, self.closed = 40.0, 0.1, False, False
        self.status = Status.OK

    def fail_reads(self) -> None:
        """Reads fail from now on, as the contract says: a status with a detail."""
        self.status = Status.FAILED

    def discover(self) -> list[Device]:
        ch = Channel(self.CID, "hwmon:nvme-pci-0200", "temp1", Quantity.TEMPERATURE, "°C")
        return [Device("hwmon:nvme-pci-0200", DeviceKind.HWMON, "nvme", (ch,))]

    def sample(self) -> Sample:
        if self.gate is not None:
            self.gate.acquire()
        start = self.clock.monotonic()
        self.clock.advance(self.duration_s)
        if self.fail:
            raise OSError(5, "EIO")
        value = self.value if self.status == Status.OK else None
        detail = None if value is not None else EIO
        return Sample(start, {self.CID: Reading(self.CID, value, self.status, detail)})

    def locator(self) -> dict[str, Any]:
        return {"backend": "hwmon", "sysfs_root": "/x"}

    def close(self) -> None:
        self.closed = True
