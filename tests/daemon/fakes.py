"""A small in-memory backend keeping the Backend protocol, with fault injection, for the daemon's tests.

Units as the hwmon backend: pwm duty in % held as a raw 0–255 ``pwm`` with a ``pwmN_enable``-like mode
(1 manual, 2 auto); temperatures in °C. ``on_write`` is called before each write (tests check the journal
there); ``rewriter`` is another fan controller: before each sample it sets the knobs it names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aithermd.errors import BackendError, DeviceLost
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
        self.fail_write: dict[str, BaseException] = {}
        self.fail_read: set[str] = set()
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
        if self.lost:
            return Sample(self._clock(), lost=frozenset({self.device_id}))
        readings = {}
        for name, value in self.temps.items():
            cid = self.kid(name)
            if name in self.failed_temps:
                readings[cid] = Reading(cid, None, Status.FAILED, "EIO")
            else:
                readings[cid] = Reading(cid, value)
        knobs = {self.kid(p): self._kv(p) for p in self.pwm}
        return Sample(self._clock(), readings, knobs)

    def _name(self, knob_id: str) -> str:
        dev, _, name = knob_id.rpartition("/")
        if dev != self.device_id or name not in self.pwm:
            raise BackendError(f"unknown knob {knob_id}")
        return name

    def _kv(self, name: str) -> KnobValue:
        raw = self.stuck.get(name, self.pwm[name])
        extra = {"enforced_w": self.enforced_w} if self.enforced_w is not None else {}
        return KnobValue(self.kid(name), pwm_to_pct(raw), MODES.get(self.enable[name], "auto"), extra=extra)

    def write_knob(self, knob_id: str, value: float) -> None:
        name = self._name(knob_id)
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
        name = self._name(knob_id)
        if name in self.fail_read:
            raise BackendError(f"{knob_id}: EIO")
        return self._kv(name)

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        name = self._name(knob_id)
        return {"pwm": self.pwm[name], "enable": self.enable[name]}

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        name = self._name(knob_id)
        self.pwm[name] = int(saved["pwm"])
        self.enable[name] = int(saved["enable"])

    def locator(self) -> dict[str, Any]:
        return {"backend": "fake", "name": self.name}

    def close(self) -> None:
        self.closed = True
