"""CPU backend (psutil): device ``cpu`` with total and per-core utilization, load average and frequency.

Channels (ids ``cpu/<attribute>``): ``utilization`` (%, all cores), ``cpu<N>`` (%, logical CPU N),
``load1``/``load5``/``load15`` (run-queue load average, no unit), ``frequency`` (MHz, current average, only
when psutil can read it). Utilization is the busy share of the CPU time that passed between two samples
(``psutil.cpu_times(percpu=True)``: busy = total − idle − iowait, guest time excluded from the total as psutil
does); discovery takes the first reference, so the first sample already has a value when time has passed.
No knobs. ``psutil_module`` is injectable for tests.
"""

from __future__ import annotations

from typing import Any

import psutil

from aithermd.backends.base import ReadOnly
from aithermd.clock import Clock, RealClock
from aithermd.model import UNITS, Channel, Device, DeviceKind, Quantity, Reading, Sample, Status

DEVICE_ID = "cpu"


def _fields(times: Any) -> dict[str, float]:
    return dict(times._asdict())


def _totals(times: dict[str, float]) -> tuple[float, float]:
    """(total, idle) seconds of one CPU's times; guest time is already inside user/nice on Linux."""
    total = sum(times.values()) - times.get("guest", 0.0) - times.get("guest_nice", 0.0)
    return total, times.get("idle", 0.0) + times.get("iowait", 0.0)


def _sum(per_cpu: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(t.get(k, 0.0) for t in per_cpu) for k in per_cpu[0]}


def _utilization(before: dict[str, float], after: dict[str, float]) -> float | None:
    t0, i0 = _totals(before)
    t1, i1 = _totals(after)
    dt = t1 - t0
    if dt <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (dt - (i1 - i0)) / dt))


class CpuBackend(ReadOnly):
    """The ``cpu`` device read through ``psutil_module`` (default: :mod:`psutil`)."""

    kind = "cpu"

    def __init__(self, psutil_module: Any = psutil, clock: Clock | None = None) -> None:
        self.psutil = psutil_module
        self.clock = clock or RealClock()
        self._prev: list[Any] | None = None
        self._device: Device | None = None
        self._has_freq = False

    def discover(self) -> list[Device]:
        ps = self.psutil
        self._prev = [_fields(t) for t in ps.cpu_times(percpu=True)]
        count = len(self._prev)
        try:
            self._has_freq = ps.cpu_freq() is not None
        except (OSError, NotImplementedError, AttributeError, RuntimeError, ValueError):
            self._has_freq = False

        def ch(attribute: str, quantity: Quantity, label: str | None = None) -> Channel:
            return Channel(
                id=f"{DEVICE_ID}/{attribute}",
                device_id=DEVICE_ID,
                attribute=attribute,
                quantity=quantity,
                unit=UNITS[quantity],
                label=label,
            )

        channels = [ch("utilization", Quantity.UTILIZATION, "CPU utilization")]
        channels += [ch(f"cpu{n}", Quantity.UTILIZATION, f"CPU {n}") for n in range(count)]
        channels += [ch(f"load{m}", Quantity.LOAD, f"load average {m} min") for m in (1, 5, 15)]
        if self._has_freq:
            channels.append(ch("frequency", Quantity.CLOCK, "CPU frequency"))
        self._device = Device(
            id=DEVICE_ID,
            kind=DeviceKind.CPU,
            name=f"CPU ({count} logical)",
            channels=tuple(channels),
            info={"logical_cpus": count},
        )
        return [self._device]

    def sample(self) -> Sample:
        ps = self.psutil
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}

        def put(
            attribute: str, value: float | None, status: Status = Status.STALE, detail: str | None = None
        ) -> None:
            """A value reads ok; None reads ``status`` (stale: no CPU time passed since the last sample)."""
            cid = f"{DEVICE_ID}/{attribute}"
            if value is not None:
                readings[cid] = Reading(cid, value)
            else:
                readings[cid] = Reading(
                    cid, None, status, detail or "no CPU time passed since the last sample"
                )

        try:
            now = [_fields(t) for t in ps.cpu_times(percpu=True)]
        except OSError as exc:
            now = None
            for c in self._device.channels if self._device else ():
                if c.quantity == Quantity.UTILIZATION:
                    put(c.attribute, None, Status.FAILED, str(exc))
        if now is not None:
            prev = self._prev if self._prev is not None and len(self._prev) == len(now) else None
            if prev is None:  # no reference yet (or the CPU count changed): every utilization is stale
                put("utilization", None)
                for n in range(len(now)):
                    put(f"cpu{n}", None)
            else:
                put("utilization", _utilization(_sum(prev), _sum(now)))
                for n, (a, b) in enumerate(zip(prev, now, strict=True)):
                    put(f"cpu{n}", _utilization(a, b))
            self._prev = now
        try:
            for m, value in zip((1, 5, 15), ps.getloadavg(), strict=True):
                put(f"load{m}", float(value))
        except OSError as exc:
            for m in (1, 5, 15):
                put(f"load{m}", None, Status.FAILED, str(exc))
        if self._has_freq:
            try:
                freq = ps.cpu_freq()
                put(
                    "frequency",
                    float(freq.current) if freq is not None else None,
                    Status.FAILED,
                    None if freq is not None else "psutil.cpu_freq() returned None",
                )
            except (OSError, NotImplementedError, RuntimeError) as exc:
                put("frequency", None, Status.FAILED, str(exc))
        return Sample(t=t, readings=readings)


    def locator(self) -> dict[str, Any]:
        return {"backend": "cpu"}

    def close(self) -> None:
        self._prev = None
