"""CPU backend: device ``cpu`` with utilization, load average and frequency, read once per tick from procfs.

Channels (ids ``cpu/<attribute>``): ``utilization`` (%, all CPUs), ``load1``/``load5``/``load15`` (run-queue
load average, no unit), ``frequency`` (MHz, the mean ``scaling_cur_freq`` of the cpufreq policies under the
sysfs root; only when there are some), and with ``per_cpu=True`` ``cpu<N>`` (%, logical CPU N).

Sources (proc(5), the kernel's cpufreq documentation): ``<proc_root>/stat`` — its first line is the sum over
CPUs, in USER_HZ, of user nice system idle iowait irq softirq steal guest guest_nice; ``<proc_root>/loadavg``;
``<sysfs_root>/devices/system/cpu/cpufreq/policy*/scaling_cur_freq`` in kHz. Each is kept open and read with
one ``pread`` per tick; only the first line of ``stat`` is parsed unless ``per_cpu`` (no per-CPU objects
are built for the totals, and ``/proc/cpuinfo`` is never read). Utilization is the busy share of the CPU
time that passed between two samples: busy = total − idle − iowait, guest time excluded from the total (it
is already inside user and nice), as psutil computes it; discovery takes the first reference, so the first
sample already has a value when time has passed.

``psutil_module`` (the simulator's CPU, tests) replaces procfs: ``cpu_times(percpu=...)``,
``getloadavg()`` and ``cpu_freq()`` give the same figures.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from aithermd.backends.base import ReadOnly
from aithermd.clock import Clock, RealClock
from aithermd.model import UNITS, Channel, Device, DeviceKind, Quantity, Reading, Sample, Status

DEVICE_ID = "cpu"
STALE = "no CPU time passed since the last sample"
Times = tuple[float, float]  # (total, idle) CPU time of one line, any unit


def _totals(fields: list[float]) -> Times:
    """(total, idle) of one CPU line's fields (user nice system idle iowait irq softirq steal guest
    guest_nice); guest time is already inside user/nice on Linux."""
    total = sum(fields) - sum(fields[8:10])
    return total, fields[3] + (fields[4] if len(fields) > 4 else 0.0)


def _utilization(before: Times, after: Times) -> float | None:
    dt = after[0] - before[0]
    if dt <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (dt - (after[1] - before[1])) / dt))


class ProcFiles:
    """``stat`` and ``loadavg`` of one procfs, kept open. Raises OSError."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._stat = os.open(os.path.join(proc_root, "stat"), os.O_RDONLY | os.O_CLOEXEC)
        self._load = os.open(os.path.join(proc_root, "loadavg"), os.O_RDONLY | os.O_CLOEXEC)
        self._size = 4096

    def times(self, per_cpu: bool) -> list[Times]:
        """[all CPUs, cpu0, cpu1, …] (only the first unless ``per_cpu``)."""
        while True:
            data = os.pread(self._stat, self._size, 0)
            if len(data) < self._size or not per_cpu:
                break
            self._size *= 2
        if not per_cpu:
            end = data.find(b"\n")
            return [_totals([float(x) for x in data[:end].split()[1:]])]
        out = []
        for line in data.split(b"\n"):
            if not line.startswith(b"cpu"):
                break
            out.append(_totals([float(x) for x in line.split()[1:]]))
        return out

    def loadavg(self) -> tuple[float, float, float]:
        f = os.pread(self._load, 128, 0).split()
        return float(f[0]), float(f[1]), float(f[2])

    def close(self) -> None:
        for fd in (self._stat, self._load):
            try:
                os.close(fd)
            except OSError:
                pass


class CpuBackend(ReadOnly):
    """The ``cpu`` device from ``proc_root`` (or ``psutil_module``) and the cpufreq of ``sysfs_root``."""

    kind = "cpu"

    def __init__(self, psutil_module: Any = None, clock: Clock | None = None, *, proc_root: str = "/proc",
                 sysfs_root: str | None = None, per_cpu: bool = False) -> None:
        self.psutil = psutil_module
        self.clock = clock or RealClock()
        self.proc_root, self.sysfs_root, self.per_cpu = proc_root, sysfs_root, per_cpu
        self._proc: ProcFiles | None = None
        self._freq_fds: list[int] = []
        self._prev: list[Times] | None = None
        self._device: Device | None = None
        self._has_freq = False
        self._ids: dict[str, str] = {}

    # -- sources ---------------------------------------------------------------------------------------
    def _times(self) -> list[Times]:
        if self.psutil is None:
            if self._proc is None:
                self._proc = ProcFiles(self.proc_root)
            return self._proc.times(self.per_cpu)
        if self.per_cpu:
            per = [_totals(list(t)) for t in self.psutil.cpu_times(percpu=True)]
            return [(sum(t for t, _ in per), sum(i for _, i in per)), *per]
        all_ = self.psutil.cpu_times(percpu=False)
        if isinstance(all_, list):  # a psutil stand-in that only answers per CPU
            per = [_totals(list(t)) for t in all_]
            return [(sum(t for t, _ in per), sum(i for _, i in per))]
        return [_totals(list(all_))]

    def _loadavg(self) -> tuple[float, float, float]:
        if self.psutil is not None:
            return tuple(self.psutil.getloadavg())  # type: ignore[return-value]
        assert self._proc is not None
        return self._proc.loadavg()

    def _frequency(self) -> float | None:
        """Mean current frequency, MHz."""
        if self.psutil is not None:
            freq = self.psutil.cpu_freq()
            return float(freq.current) if freq is not None else None
        khz = [int(os.pread(fd, 32, 0)) for fd in self._freq_fds]
        return sum(khz) / len(khz) / 1000.0 if khz else None

    def _open_freq(self) -> bool:
        if self.psutil is not None:
            try:
                return self.psutil.cpu_freq() is not None
            except (OSError, NotImplementedError, AttributeError, RuntimeError, ValueError):
                return False
        if self.sysfs_root is None:
            return False
        pattern = os.path.join(self.sysfs_root, "devices", "system", "cpu", "cpufreq", "policy*",
                               "scaling_cur_freq")
        for path in sorted(glob.glob(pattern)):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                int(os.pread(fd, 32, 0))
            except (OSError, ValueError):
                continue
            self._freq_fds.append(fd)
        return bool(self._freq_fds)

    # -- the backend -----------------------------------------------------------------------------------
    def discover(self) -> list[Device]:
        self._close_freq()
        self._prev = self._times()
        count = self._count()
        self._has_freq = self._open_freq()

        def ch(attribute: str, quantity: Quantity, label: str | None = None) -> Channel:
            return Channel(id=f"{DEVICE_ID}/{attribute}", device_id=DEVICE_ID, attribute=attribute,
                           quantity=quantity, unit=UNITS[quantity], label=label)

        channels = [ch("utilization", Quantity.UTILIZATION, "CPU utilization")]
        if self.per_cpu:
            channels += [ch(f"cpu{n}", Quantity.UTILIZATION, f"CPU {n}") for n in range(len(self._prev) - 1)]
        channels += [ch(f"load{m}", Quantity.LOAD, f"load average {m} min") for m in (1, 5, 15)]
        if self._has_freq:
            channels.append(ch("frequency", Quantity.CLOCK, "CPU frequency"))
        self._ids = {c.attribute: c.id for c in channels}
        self._device = Device(id=DEVICE_ID, kind=DeviceKind.CPU, name=f"CPU ({count} logical)",
                              channels=tuple(channels), info={"logical_cpus": count})
        return [self._device]

    def _count(self) -> int:
        if self.per_cpu and self._prev is not None:
            return len(self._prev) - 1
        if self.psutil is not None and hasattr(self.psutil, "cpu_count"):
            return int(self.psutil.cpu_count(logical=True) or 0)
        if self.psutil is not None:
            return len(self.psutil.cpu_times(percpu=True))
        return os.cpu_count() or 0

    def sample(self) -> Sample:
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}
        ids = self._ids

        def put(attribute: str, value: float | None, status: Status = Status.STALE, detail: str = STALE) -> None:
            cid = ids.get(attribute) or f"{DEVICE_ID}/{attribute}"
            readings[cid] = Reading(cid, value) if value is not None else Reading(cid, None, status, detail)

        try:
            now = self._times()
        except (OSError, ValueError, IndexError) as exc:
            now = None
            for c in self._device.channels if self._device else ():
                if c.quantity == Quantity.UTILIZATION:
                    put(c.attribute, None, Status.FAILED, str(exc))
        if now is not None:
            prev = self._prev if self._prev is not None and len(self._prev) == len(now) else None
            put("utilization", _utilization(prev[0], now[0]) if prev is not None else None)
            if self.per_cpu:  # without a reference (or when the CPU count changed) every one is stale
                for n in range(len(now) - 1):
                    put(f"cpu{n}", _utilization(prev[n + 1], now[n + 1]) if prev is not None else None)
            self._prev = now
        try:
            for m, value in zip((1, 5, 15), self._loadavg(), strict=True):
                put(f"load{m}", float(value))
        except (OSError, ValueError, IndexError) as exc:
            for m in (1, 5, 15):
                put(f"load{m}", None, Status.FAILED, str(exc))
        if self._has_freq:
            try:
                freq = self._frequency()
                put("frequency", freq, Status.FAILED, "no frequency read")
            except (OSError, ValueError, NotImplementedError, RuntimeError) as exc:
                put("frequency", None, Status.FAILED, str(exc))
        return Sample(t=t, readings=readings)

    def locator(self) -> dict[str, Any]:
        return {"backend": "cpu"}

    def _close_freq(self) -> None:
        for fd in self._freq_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._freq_fds = []

    def close(self) -> None:
        self._prev = None
        self._close_freq()
        if self._proc is not None:
            self._proc.close()
            self._proc = None
