"""Splitting one device's energy over one accounting interval among the processes that used it. Pure.

A device's energy in the interval (``energy_j``, from its own counter) is split in two (the Kepler model,
for a workstation):

- **idle**: what the device draws doing nothing, ``idle floor (W) × interval (s)`` (never more than the
  energy itself; :class:`IdleFloor` learns the floor);
- **active**: the rest, shared by how much each process used the device.

GPU (:func:`split_gpu`): the active part is shared by each process's utilization in the interval
(``nvmlDeviceGetProcessUtilization`` samples: SM + encoder + decoder %, summed over the samples), basis
``utilization``; where the driver gives none (MIG, older boards) or no holder was busy, by GPU memory
held, basis ``memory``; where memory is unknown too (NVML_VALUE_NOT_AVAILABLE), evenly, basis ``even``. The
idle part of a GPU some process holds is shared evenly among its holders (they keep the card awake); the
idle part of a GPU nobody holds, and active energy with no holder to charge (a process NVML does not
list, e.g. in another PID namespace), stay unattributed (``idle_j``, ``unattributed_j``).

CPU (:func:`split_cpu`): RAPL package energy; the active part is shared by each process's CPU time in the
interval (user + system, psutil), basis ``cpu_time``; the idle part belongs to the machine (``idle_j``).

Every split adds up: ``sum(share.active_j + share.idle_j) + idle_j + unattributed_j == energy_j`` (to float
rounding), and a process is only ever charged from its own utilization, memory or CPU time.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

UTILIZATION, MEMORY, EVEN, CPU_TIME = "utilization", "memory", "even", "cpu_time"


@dataclass(frozen=True, slots=True)
class Holder:
    """A process on a GPU this interval: ``busy`` its utilization weight (None: the driver gives none),
    ``memory_bytes`` the GPU memory it holds (None: unknown)."""

    key: Hashable
    busy: float | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Share:
    """What one process is charged on one device for one interval (J)."""

    key: Hashable
    active_j: float
    idle_j: float
    basis: str

    @property
    def total_j(self) -> float:
        return self.active_j + self.idle_j


@dataclass(frozen=True, slots=True)
class Split:
    """One device's interval: ``energy_j`` = Σ shares + ``idle_j`` + ``unattributed_j``."""

    device: str
    energy_j: float
    shares: tuple[Share, ...] = ()
    idle_j: float = 0.0
    unattributed_j: float = 0.0
    basis: str | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


def _clean(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) and x > 0 else 0.0


def _parts(energy_j: float, dt_s: float, idle_floor_w: float | None) -> tuple[float, float, float]:
    energy = _clean(energy_j)
    idle = min(energy, _clean(idle_floor_w) * _clean(dt_s))
    return energy, idle, energy - idle


def _weights(holders: Sequence[Holder]) -> tuple[list[float], str]:
    busy = [_clean(h.busy) for h in holders]
    if any(h.busy is not None for h in holders) and sum(busy) > 0:
        return busy, UTILIZATION
    memory = [_clean(h.memory_bytes) for h in holders]
    if sum(memory) > 0:
        return memory, MEMORY
    return [1.0] * len(holders), EVEN


def split_gpu(device: str, energy_j: float, dt_s: float, idle_floor_w: float | None,
              holders: Sequence[Holder]) -> Split:
    """Split a GPU's ``energy_j`` over ``dt_s`` among ``holders`` (see the module docstring)."""
    energy, idle, active = _parts(energy_j, dt_s, idle_floor_w)
    if not holders:
        return Split(device, energy, (), idle, active)
    weights, basis = _weights(holders)
    total = sum(weights)
    idle_each = idle / len(holders)
    shares = tuple(Share(h.key, active * (w / total), idle_each, basis) for h, w in zip(holders, weights,
                                                                                       strict=True))
    return Split(device, energy, shares, 0.0, 0.0, basis)


def split_cpu(device: str, energy_j: float, dt_s: float, idle_floor_w: float | None,
              cpu_seconds: Mapping[Hashable, float]) -> Split:
    """Split CPU package ``energy_j`` over ``dt_s`` by ``cpu_seconds`` per process (see the module
    docstring); processes with no CPU time in the interval get no share."""
    energy, idle, active = _parts(energy_j, dt_s, idle_floor_w)
    used = {k: _clean(v) for k, v in cpu_seconds.items() if _clean(v) > 0}
    total = sum(used.values())
    if total <= 0:
        return Split(device, energy, (), idle, active)
    shares = tuple(Share(k, active * (v / total), 0.0, CPU_TIME) for k, v in used.items())
    return Split(device, energy, shares, idle, 0.0, CPU_TIME, {"cpu_s": total})


class IdleFloor:
    """A device's idle draw (W), learnt from its mean power per interval.

    It is first set by an *idle* interval (a GPU nobody holds or whose holders keep it under 5 %, a CPU with
    less than half a core of process time): a daemon started under load must not take the load for the
    floor. Until then it is None (no idle
    part: all energy is active). Then it drops at once to any lower draw seen (busy or not: a busy device
    drawing less than the floor proves the floor too high) and rises towards a higher idle draw only slowly
    (``rise_s``, an hour by default), so one odd interval cannot lift it. ``value`` may be seeded from the
    state directory."""

    def __init__(self, value: float | None = None, *, rise_s: float = 3600.0) -> None:
        self.value = value if value is not None and math.isfinite(value) and value >= 0 else None
        self.rise_s = rise_s

    def observe(self, power_w: float, dt_s: float, *, idle: bool) -> float | None:
        if not math.isfinite(power_w) or power_w < 0 or not math.isfinite(dt_s) or dt_s <= 0:
            return self.value
        if self.value is None:
            if idle:
                self.value = power_w
        elif power_w < self.value:
            self.value = power_w
        elif idle:
            self.value += (power_w - self.value) * min(1.0, dt_s / self.rise_s)
        return self.value
