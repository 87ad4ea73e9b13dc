"""Slow sensors: read in a worker of their own, at their own cadence, against their own deadline.

An nvme or drivetemp ``temp1_input`` read asks the device (an admin or SMART command) and can take tens to
hundreds of milliseconds, or hang with the device (:mod:`aithermd.backends.hwmon_subset`). Such a chip is
never read on the event loop: a :class:`SlowBackend` wraps a backend over the slow chips, reads it in its
own thread every ``cadence_s`` and hands the loop the last completed sample. Its :meth:`SlowBackend.sample`
only looks at that sample (no I/O, no lock held by a reader), so a slow or hung read never delays the loop.

Freshness (in the channel's own terms, not the loop's): a read must finish within ``deadline_s`` of its
start. The values of the last read are ``ok`` while that read was on time and no newer read is overdue
(now − start of the last read ≤ ``cadence_s`` + ``deadline_s``); otherwise every ok reading is reported
:attr:`~aithermd.model.Status.STALE` with its last value carried and the reason in ``detail`` — a late
value is stale. Stale is a health problem: the safety layer drives the fans that read it to full. A read
that raises leaves the previous sample in place (it then goes stale). Before the first read completes the
readings are stale without a value.

Rediscovery (hotplug) never touches an inner backend a read may still be using: :meth:`SlowBackend.discover`
builds a fresh inner backend and a fresh reader thread and retires the old pair (the old thread closes its
backend when its read, hung or not, returns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import structlog

from aithermd.backends.base import Backend, ReadOnly
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.hwmon_subset import SLOW_DRIVERS, HwmonSubset
from aithermd.clock import Clock, RealClock
from aithermd.model import Device, Reading, Sample, Status


@dataclass(frozen=True, slots=True)
class SlowOptions:
    """``cadence_s``: time between read starts (s); ``deadline_s``: longest a read may take (s);
    ``first_wait_s``: how long :meth:`SlowBackend.discover` waits for the first read (s)."""

    cadence_s: float = 5.0
    deadline_s: float = 2.0
    first_wait_s: float = 0.25


class _Reader:
    """One reader thread bound to one inner backend. ``last``: (start, end, sample) of the newest completed
    read (replaced whole, so the loop reads it without a lock)."""

    def __init__(self, inner: Backend, options: SlowOptions, clock: Clock, name: str) -> None:
        self.inner, self.options, self.clock = inner, options, clock
        self.last: tuple[float, float, Sample] | None = None
        self.reads = self.late = self.failures = 0
        self.retired = False
        self._wake = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"aithermd-slow-{name}", daemon=True)
        self._log = structlog.get_logger("aithermd.slow")

    def start(self) -> None:
        self._thread.start()

    def read_once(self) -> None:
        """One read of every channel of the inner backend, timed on the clock (the thread's body; tests
        call it directly)."""
        t0 = self.clock.monotonic()
        try:
            sample = self.inner.sample()
        except Exception as exc:  # noqa: BLE001 - a failing device never ends the worker
            self.failures += 1
            self._log.warning("slow_read_failed", backend=getattr(self.inner, "kind", "?"), error=str(exc))
            return
        t1 = self.clock.monotonic()
        self.reads += 1
        if t1 - t0 > self.options.deadline_s:
            self.late += 1
            self._log.warning("slow_read_late", took_s=round(t1 - t0, 3), deadline_s=self.options.deadline_s)
        self.last = (t0, t1, sample)
        self._first.set()

    def _run(self) -> None:
        while not self.retired:
            begun = self.clock.monotonic()
            self.read_once()
            if self.retired:
                break
            self._wake.wait(max(0.0, begun + self.options.cadence_s - self.clock.monotonic()))
        self._close()

    def _close(self) -> None:
        try:
            self.inner.close()
        except Exception:  # noqa: BLE001 - closing never fails the daemon
            pass

    def wait_first(self, timeout_s: float) -> bool:
        return self._first.wait(timeout_s)

    def retire(self) -> None:
        """Stop after the read in progress (if any); the thread then closes the inner backend."""
        self.retired = True
        self._wake.set()
        if not self._thread.is_alive():
            self._close()


class SlowBackend(ReadOnly):
    """Wraps ``factory()`` (a backend over slow sensors, without knobs) so that it is read off the loop.

    ``kind`` is the inner kind + ``-slow``; ``locator()`` is the inner one's (with ``"lane": "slow"`` for
    an :class:`HwmonSubset`). ``sample()`` never does I/O."""

    def __init__(self, factory: Callable[[], Backend], options: SlowOptions | None = None,
                 clock: Clock | None = None, name: str = "slow", *, start: bool = True) -> None:
        self.factory = factory
        self.start = start  # False: no reader thread; reads happen when ``reader.read_once()`` is called
        self.options = options or SlowOptions()
        self.clock = clock or RealClock()
        self.name = name
        probe = factory()
        self.kind = f"{getattr(probe, 'kind', 'backend')}-slow"
        self._locator = probe.locator()
        probe.close()
        self._reader: _Reader | None = None
        self._devices: list[Device] = []
        self._channels: tuple[str, ...] = ()
        self._stale_cache: tuple[Any, Sample] | None = None

    @property
    def reader(self) -> _Reader | None:
        return self._reader

    def discover(self) -> list[Device]:
        """Discover on a fresh inner backend, start its reader, wait up to ``first_wait_s`` for its first
        read. Knobs are not offered (a slow chip with knobs stays inline)."""
        inner = self.factory()
        devices = inner.discover()
        old, self._reader = self._reader, None
        if old is not None:
            old.retire()
        self._devices = [d if not d.knobs else _without_knobs(d) for d in devices]
        self._channels = tuple(c.id for d in self._devices for c in d.channels)
        self._stale_cache = None
        if not self._devices:
            inner.close()
            return []
        reader = _Reader(inner, self.options, self.clock, self.name)
        self._reader = reader
        if not self.start:
            return list(self._devices)
        reader.start()
        if self.options.first_wait_s > 0:
            reader.wait_first(self.options.first_wait_s)
        return list(self._devices)

    def sample(self) -> Sample:
        """The last completed read, its ok readings marked stale when it was late or a newer read is
        overdue. Never blocks."""
        reader = self._reader
        now = self.clock.monotonic()
        if reader is None:
            return Sample(now)
        last = reader.last
        opts = self.options
        if last is None:
            return self._stale(("first",), now, None, "no reading yet")
        start, end, sample = last
        if end - start > opts.deadline_s:
            why = f"read took {end - start:.3g} s, deadline {opts.deadline_s:g} s"
            return self._stale(last, now, sample, why)
        if now - start > opts.cadence_s + opts.deadline_s:
            return self._stale(last, now, sample, f"no read within its {opts.deadline_s:g} s deadline")
        return sample

    def _stale(self, key: Any, now: float, sample: Sample | None, why: str) -> Sample:
        cached = self._stale_cache
        if cached is not None and cached[0] is key:
            return cached[1]
        readings: dict[str, Reading] = {}
        old = sample.readings if sample is not None else {}
        for cid in self._channels:
            r = old.get(cid)
            if r is None or r.status == Status.OK:
                readings[cid] = Reading(cid, r.value if r is not None else None, Status.STALE, why)
            else:
                readings[cid] = r
        out = Sample(now, readings, lost=sample.lost if sample is not None else frozenset())
        self._stale_cache = (key, out)
        return out


    def locator(self) -> dict[str, Any]:
        return dict(self._locator)

    def close(self) -> None:
        """Retire the reader (its thread closes the inner backend once its read returns)."""
        if self._reader is not None:
            self._reader.retire()
            self._reader = None


def _without_knobs(device: Device) -> Device:
    return replace(device, knobs=())


def split_slow(backends: Sequence[Backend], options: SlowOptions | None = None,
               drivers: Sequence[str] = SLOW_DRIVERS) -> list[Backend]:
    """``backends`` with each plain :class:`HwmonBackend` split in two: the same tree without the slow
    drivers (read inline), followed by one :class:`SlowBackend` per slow driver (read in its worker)."""
    out: list[Backend] = []
    for b in backends:
        if type(b) is not HwmonBackend:
            out.append(b)
            continue
        root, io, clock, leave = b.sysfs_root, b.io, b.clock, b.leave
        out.append(HwmonSubset(root, drivers=drivers, keep="except", io=io, clock=clock, leave=leave))
        for driver in drivers:
            factory = partial(HwmonSubset, root, drivers=(driver,), keep="only", io=io, clock=clock, leave=leave)
            out.append(SlowBackend(factory, options, clock, name=driver))
    return out
