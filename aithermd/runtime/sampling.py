"""Sampling: one read of every backend of the world, and of the process list when a policy needs it.

Every backend is read in one pass in the read guard's thread (:mod:`aithermd.backends.guard`): the inline
ones (hwmon, powercap, thermal zones, cpu, the slow lane's cached samples) under its deadline (a read that
hangs quarantines its device, whose channels go stale, and never holds the loop), then the threaded ones
(NVML, which hands its GPUs to its own worker under a deadline per GPU) under the worker's budget
(:class:`~aithermd.actuate.worker.Worker`). One hand-off per tick, with or without GPUs: NVML used to take
a second one, an asyncio hop to the loop's worker thread. The process list (only when a policy needs it: a
scan of /proc takes milliseconds) is the one job still awaited on the worker. A backend whose ``sample()``
raises gets every channel marked failed (its fans then go to full through the engine's safety layer) and
one fault event; threaded backends that did not answer within the budget are marked failed the same way,
and their knobs are not written that tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from aithermd.actuate.worker import Worker
from aithermd.backends.base import Backend
from aithermd.backends.guard import ReadGuard
from aithermd.clock import Clock
from aithermd.model import Event, KnobValue, Reading, Sample, Status
from aithermd.runtime.health import fault
from aithermd.runtime.world import World


def list_processes() -> frozenset[str]:
    """Names and command lines of the running processes, for policies with ``process`` conditions
    (patterns match either). psutil; runs in the worker thread."""
    import psutil
    out: set[str] = set()
    for proc in psutil.process_iter(["name", "cmdline"]):
        info = proc.info
        if info.get("name"):
            out.add(info["name"])
        if info.get("cmdline"):
            out.add(" ".join(info["cmdline"]))
    return frozenset(out)


@dataclass
class Sampled:
    """One tick's reads merged: ``readings`` by channel id, ``knobs`` by knob id (values in daemon units),
    ``attrs`` by device id, ``lost`` device ids, ``health`` by source family, ``processes`` (empty unless a
    policy needs them), ``hop_ok`` (False when a threaded backend's read did not answer within the worker's
    budget: its knobs are not written this tick) and the ``events`` of new faults."""

    readings: dict[str, Reading] = field(default_factory=dict)
    knobs: dict[str, KnobValue] = field(default_factory=dict)
    attrs: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    health: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    processes: Any = frozenset()
    hop_ok: bool = True
    events: list[Event] = field(default_factory=list)


class Pass(NamedTuple):
    """What one pass over ``world`` reads with: the ``backends`` in order, ``one(backend)`` (its sample, kept
    in ``made`` by ``id``: a threaded one may be late), ``budget(backend)`` (s, None: inline; None: no
    threaded backend), the ``events`` its thread adds."""

    backends: tuple[Backend, ...]
    one: Callable[[Backend], Sample]
    budget: Callable[[Backend], float | None] | None
    events: list[Event]
    made: dict[int, Sample]
    world: World


class Sampler:
    """Reads a :class:`~aithermd.runtime.world.World` once per tick (see the module doc). ``processes()``
    lists the running processes (default :func:`list_processes`)."""

    def __init__(self, clock: Clock, worker: Worker,
                 processes: Callable[[], Any] = list_processes) -> None:
        self.clock, self.worker, self.processes = clock, worker, processes
        self._world: World | None = None
        self._channels: dict[int, tuple[str, ...]] = {}
        self._failed_backends: set[int] = set()
        self._hop_faulted = False
        self._ahead: Pass | None = None  # the pass the guard's thread takes ahead (ahead())
        self.guard = ReadGuard()
        self._log = structlog.get_logger("aithermd.sampling")

    def _channels_of(self, world: World) -> dict[int, tuple[str, ...]]:
        """Channel ids per backend (by ``id(backend)``), worked out once per world."""
        if world is not self._world:
            by_backend: dict[int, list[str]] = {id(b): [] for b in world.backends}
            for device in world.devices:
                backend = world.device_owner.get(device.id)
                if backend is not None:
                    by_backend.setdefault(id(backend), []).extend(c.id for c in device.channels)
            self._channels = {k: tuple(v) for k, v in by_backend.items()}
            self._world = world
        return self._channels

    def _pass(self, world: World, t_wall: float | None) -> Pass:
        """What one pass over ``world`` reads with (:class:`Pass`)."""
        reads: list[Event] = []  # filled by the guard's thread; copied once the pass is over or cut short
        made: dict[int, Sample] = {}
        inline, threaded = world.inline, world.threaded
        mine = {id(b) for b in threaded}
        budget = self.worker.budget_s

        def one(b: Backend) -> Sample:
            made[id(b)] = sample = self._one(b, self._channels, t_wall, reads)
            return sample

        return Pass((*inline, *threaded) if threaded else inline, one,
                    (lambda b: budget if id(b) in mine else None) if threaded else None, reads, made, world)

    def ahead(self, world: World, at: float, after: Callable[[], None]) -> float | None:
        """Have the read guard's thread take the next tick's pass over ``world`` at monotonic ``at`` (s) and
        call ``after()`` once it is over (:meth:`ReadGuard.ahead`); the next :meth:`sample` takes it.
        Returns how long past ``at`` the pass may take before the tick should wait for it itself (s), None
        when nothing was started."""
        if self._ahead is not None or not (world.inline or world.threaded):
            return None
        self._channels_of(world)
        pass_ = self._pass(world, None)
        if not self.guard.ahead(pass_.backends, pass_.one, pass_.budget, at, after):
            return None
        self._ahead = pass_
        return self.guard.margin_s()

    def forget(self) -> None:
        """The pass taken ahead is not used (something was written since it was armed): read anew."""
        if self._ahead is not None:
            self._ahead = None
            self.guard.forget()

    async def sample(self, world: World, t_wall: float) -> Sampled:
        """Read every backend of ``world`` once; never raises for a device fault."""
        channels = self._channels_of(world)
        events: list[Event] = []
        inline, threaded = world.inline, world.threaded
        pass_, self._ahead = self._ahead, None
        if pass_ is not None and pass_.world is not world:  # the world changed since: that pass is not taken
            self.guard.forget()
            pass_ = None
        backends, one, budget, reads, made, _ = pass_ or self._pass(world, t_wall)
        samples = await self.guard.sample(backends, one, lambda b: channels.get(id(b), ()),
                                          self.clock.monotonic, budget)
        events += list(reads)
        hop_ok = True
        if threaded:
            first = len(inline)
            late = [b for i, b in enumerate(threaded, first) if samples[i] is not made.get(id(b))]
            if late:
                hop_ok = False
                failed = iter(self._unanswered(tuple(late), channels, t_wall, events))
                samples[first:] = [next(failed) if b in late else samples[i]
                                   for i, b in enumerate(threaded, first)]
            else:
                self._hop_faulted = False
        procs: Any = frozenset()
        if world.needs_processes:
            procs = await self.worker.hop(self._list_processes)
            procs = frozenset() if procs is None else procs
        out = Sampled(processes=procs, hop_ok=hop_ok, events=events)
        for s in samples:
            out.readings.update(s.readings)
            out.knobs.update(s.knobs)
            out.attrs.update(s.attrs)
            out.lost.update(s.lost)
            if s.health:
                out.health.update(s.health)
        return out

    def _one(self, backend: Backend, channels: Mapping[int, tuple[str, ...]], t_wall: float | None,
             events: list[Event]) -> Sample:
        try:
            sample = backend.sample()
        except Exception as exc:  # noqa: BLE001 - a device fault never ends the daemon
            if id(backend) not in self._failed_backends:
                self._failed_backends.add(id(backend))
                events.append(fault(self.clock.wall() if t_wall is None else t_wall,
                                    getattr(backend, "kind", "?"), f"sample failed: {exc}"))
            failed = {c: Reading(c, None, Status.FAILED, str(exc)) for c in channels.get(id(backend), ())}
            return Sample(self.clock.monotonic(), failed)
        self._failed_backends.discard(id(backend))
        return sample

    def hung(self, world: World) -> dict[str, str]:
        """Device id → why, for the devices of ``world``'s inline backends the read guard holds as hung now
        (quarantined, or their backend held whole): not written until they answer
        (:mod:`aithermd.actuate.hung`). A device held only for a back-off (its reads answer, slowly:
        :mod:`aithermd.backends.hangs`) is not among them: its chip answers, and its fans must follow the
        safety layer (full, its readings stale) for the whole back-off, up to 40 s (attack12 SH1)."""
        out: dict[str, str] = {}
        guard = self.guard
        for b in world.inline:
            skip = getattr(b, "skip", None)
            if skip:
                out.update((d, why) for d, why in tuple(skip.items())  # the guard's thread may change it
                           if not guard.slow(b, d))
            if guard.held(b) and not guard.slow(b):
                why = f"read hung: no answer within {guard.deadline_s:g} s"
                out.update((d, why) for d, owner in world.device_owner.items() if owner is b)
        return out

    def close(self) -> None:
        """Let the read guard's thread end (a thread stuck in a hung read ends when the read returns)."""
        self.guard.close()

    def _list_processes(self) -> Any:
        """The process list, in the worker thread; empty when the scan fails."""
        try:
            return self.processes()
        except Exception as exc:  # noqa: BLE001
            self._log.warning("process_list_failed", error=str(exc))
            return frozenset()

    def _unanswered(self, threaded: tuple[Backend, ...], channels: Mapping[int, tuple[str, ...]],
                    t_wall: float, events: list[Event]) -> list[Sample]:
        """Samples for threaded backends that did not answer: every channel failed (fans to full)."""
        why = f"no answer within {self.worker.budget_s:g} s"
        if not self._hop_faulted:
            self._hop_faulted = True
            events.append(fault(t_wall, ",".join(getattr(b, "kind", "?") for b in threaded) or "worker",
                                f"worker thread busy: {why}"))
        t = self.clock.monotonic()
        return [Sample(t, {c: Reading(c, None, Status.FAILED, why) for c in channels.get(id(b), ())})
                for b in threaded]
