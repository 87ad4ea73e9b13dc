"""One tick: sample → health → evaluate → arbitrate → actuate → publish.

- **Sample**: each inline backend's ``sample()`` on the event loop; the threaded ones (NVML) together in one
  hop to the loop's single worker thread. A backend whose ``sample()`` raises gets every channel marked
  failed (its fans then go to full through the engine's safety layer) and a fault event.
- **Health**: failed, implausible and stale readings and lost devices are marked degraded and reported
  once when they go bad; a lost device's knobs are skipped; no device fault ends the daemon.
- **Evaluate**: the pure policy engine with the active policy, the holds and the operator's overrides.
- **Arbitrate**: the engine's winning decision per knob, clamped again to the knob's constraints; a knob we
  own that no decision claims any more (or a ``default`` decision) is handed back (journaled original
  restored); no-ops are dropped by the applier.
- **Actuate**: journal first, write, read back (:mod:`aithermd.actuate.applier`).
- **Publish**: one frozen :class:`~aithermd.model.Snapshot` and the tick's events to the StateHub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.actuate.applier import Applier
from aithermd.backends.base import Backend
from aithermd.clock import Clock
from aithermd.model import Decision, Event, KnobValue, Layer, PolicyStatus, Reading, Sample, Snapshot, Status
from aithermd.publish.hub import StateHub
from aithermd.world import Engine, World

BAD = frozenset({Status.FAILED, Status.IMPLAUSIBLE, Status.STALE})


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Fetch a background hop's outcome so asyncio never warns it was not retrieved."""
    if not future.cancelled():
        future.exception()


@dataclass(frozen=True)
class Wanted:
    backend: Backend
    knob_id: str
    decision: Decision
    value: float


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


class Cycle:
    """The tick's pipeline over a :class:`World` (swap ``world`` between ticks to reload)."""

    def __init__(self, world: World, *, applier: Applier, operator: Any, hub: StateHub, engine: Engine,
                 clock: Clock, worker: Executor, tick_s: float, dry_run: bool,
                 before_sample: Callable[[float], None] | None = None,
                 processes: Callable[[], Any] = list_processes) -> None:
        self.applier, self.operator, self.hub, self.engine = applier, operator, hub, engine
        self.clock, self.worker, self.tick_s, self.dry_run = clock, worker, tick_s, dry_run
        self.before_sample = before_sample
        self.processes = processes
        self.hop_budget_s = max(tick_s, 0.5)
        self._busy: asyncio.Future[Any] | None = None
        self._hop_faulted = False
        self.state: Any = engine.initial_state()
        self.decisions: Mapping[str, Decision] = {}
        self.states: Mapping[str, Mapping[str, str]] = {}
        self._bad: dict[str, Status] = {}
        self._seen: set[str] = set()  # channels read at least once
        self._lost: set[str] = set()
        self._failed_backends: set[int] = set()
        self._log = structlog.get_logger("aithermd.cycle")
        self.world = world

    @property
    def world(self) -> World:
        return self._world

    @world.setter
    def world(self, world: World) -> None:
        self._world = world
        by_backend: dict[int, list[str]] = {id(b): [] for b in world.backends}
        for device in world.devices:
            backend = world.device_owner.get(device.id)
            if backend is not None:
                by_backend.setdefault(id(backend), []).extend(c.id for c in device.channels)
        self._channels = {k: tuple(v) for k, v in by_backend.items()}

    # -- sample ----------------------------------------------------------------------------------------
    def _sample(self, backend: Backend, t_wall: float, events: list[Event]) -> Sample:
        try:
            sample = backend.sample()
        except Exception as exc:  # noqa: BLE001 - a device fault never ends the daemon
            if id(backend) not in self._failed_backends:
                self._failed_backends.add(id(backend))
                events.append(self._fault(t_wall, getattr(backend, "kind", "?"), f"sample failed: {exc}"))
            t = self.clock.monotonic()
            channels = self._channels.get(id(backend), ())
            failed = {c: Reading(c, None, Status.FAILED, str(exc)) for c in channels}
            return Sample(t, failed)
        self._failed_backends.discard(id(backend))
        return sample

    def _sample_many(self, backends: Iterable[Backend], t_wall: float) -> tuple[list[Sample], list[Event]]:
        events: list[Event] = []
        return [self._sample(b, t_wall, events) for b in backends], events

    # -- one tick --------------------------------------------------------------------------------------
    async def tick(self, seq: int) -> Snapshot:
        """Run one tick and publish its snapshot (also returned)."""
        world = self._world
        t_mono, t_wall = self.clock.monotonic(), self.clock.wall()
        if self.before_sample is not None:
            self.before_sample(t_mono)
        events: list[Event] = []
        samples = [self._sample(b, t_wall, events) for b in world.inline]
        threaded = world.threaded
        procs: Any = frozenset()
        hop_ok = True
        if threaded or world.needs_processes:
            result = await self._hop(self._off_loop, threaded, t_wall, world.needs_processes)
            if result is None:
                hop_ok = False
                samples += self._unanswered(threaded, t_wall, events)
            else:
                more, ev, procs = result
                samples += more
                events += ev
                self._hop_faulted = False
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        attrs: dict[str, Mapping[str, Any]] = {}
        lost: set[str] = set()
        for s in samples:
            readings.update(s.readings)
            knobs.update(s.knobs)
            attrs.update(s.attrs)
            lost.update(s.lost)
        degraded = self._health(readings, knobs, lost, t_wall, events)
        for knob_id in self.applier.owned:
            knob = world.knobs.get(knob_id)
            if knob is not None and knob.device_id not in lost:
                events += self.applier.observe(knob, knobs.get(knob_id), t_mono, t_wall)
        events += self.operator.expire(t_wall)
        decided = self._evaluate(world, t_mono, t_wall, readings, knobs, attrs, procs, events)
        if decided:
            events += await self._actuate(world, knobs, lost, t_wall, hop_ok)
        degraded.update(self.applier.faults)
        degraded.update(self.applier.stepped_back)
        snapshot = Snapshot(seq=seq, t_mono=t_mono, t_wall=t_wall, devices=world.devices, readings=readings,
                            knobs=knobs, attrs=attrs, decisions=self.decisions,
                            policy=PolicyStatus(self.operator.active, tuple(self.operator.holds),
                                                self.states),
                            degraded=tuple(sorted(degraded)), dry_run=self.dry_run, tick_s=self.tick_s)
        self.hub.publish(snapshot, events)
        return snapshot

    def _off_loop(self, threaded: tuple[Backend, ...], t_wall: float,
                  want_procs: bool) -> tuple[list[Sample], list[Event], Any]:
        samples, events = self._sample_many(threaded, t_wall)
        procs: Any = frozenset()
        if want_procs:
            try:
                procs = self.processes()
            except Exception as exc:  # noqa: BLE001
                self._log.warning("process_list_failed", error=str(exc))
        return samples, events, procs

    # -- health ----------------------------------------------------------------------------------------
    def _health(self, readings: Mapping[str, Reading], knobs: Mapping[str, KnobValue], lost: set[str],
                t_wall: float, events: list[Event]) -> set[str]:
        degraded: set[str] = set(lost)
        ok = Status.OK
        seen = self._seen
        for cid, r in readings.items():
            if r.status is ok or r.status not in BAD:
                seen.add(cid)
                continue
            if r.status is Status.STALE and cid not in seen:
                seen.add(cid)  # a derived value's first read (RAPL power needs two energy reads): not a fault
                continue
            degraded.add(cid)
            if self._bad.get(cid) != r.status:
                self._bad[cid] = r.status
                events.append(self._fault(t_wall, cid, f"{cid} {r.status}: {r.detail or 'no value'}",
                                          status=str(r.status), detail=r.detail))
        for cid in [c for c in self._bad if c not in degraded]:
            del self._bad[cid]
            self._log.info("recovered", subject=cid)
        for kid, kv in knobs.items():
            if kv.status in BAD:
                degraded.add(kid)
        for device_id in lost - self._lost:
            events.append(self._fault(t_wall, device_id, f"{device_id} lost: skipped until it comes back"))
        for device_id in self._lost - lost:
            self._log.info("recovered", subject=device_id)
        self._lost = set(lost)
        return degraded

    # -- evaluate --------------------------------------------------------------------------------------
    def _evaluate(self, world: World, t_mono: float, t_wall: float, readings: Mapping[str, Reading],
                  knobs: Mapping[str, KnobValue], attrs: Mapping[str, Any], procs: Any,
                  events: list[Event]) -> bool:
        op = self.operator
        active = world.policies.get(op.active)
        if active is None:
            events.append(self._fault(t_wall, op.active, f"policy {op.active} is not loaded"))
            return False
        holds = [world.policies[n] for n in op.hold_names() if n in world.policies]
        try:
            inp = self.engine.input_type(t_mono=t_mono, t_wall=t_wall, devices=world.devices,
                                         readings=readings, knobs=knobs, attrs=attrs, processes=procs)
            result = self.engine.evaluate(active, holds, inp, self.state, op.override_values())
        except Exception as exc:  # noqa: BLE001 - keep the last settings, report, try again next tick
            self._log.exception("engine_failed")
            events.append(self._fault(t_wall, op.active, f"policy engine failed: {exc}"))
            return False
        self.state = result.state
        self.decisions = dict(result.decisions)
        self.states = result.states
        return True

    # -- arbitrate and actuate -------------------------------------------------------------------------
    def arbitrate(self, world: World, lost: set[str]) -> tuple[list[Wanted], list[str]]:
        """The writes this tick's decisions want, and the owned knobs to hand back."""
        wanted: list[Wanted] = []
        claimed: set[str] = set()
        for knob_id, d in self.decisions.items():
            knob = world.knobs.get(knob_id)
            if knob is None or knob.device_id in lost or d.value is None or d.layer == Layer.DEFAULT:
                continue
            claimed.add(knob_id)
            wanted.append(Wanted(world.owner[knob_id], knob_id, d, knob.clamp(float(d.value))))
        back = [k for k in self.applier.owned if k not in claimed and k in world.knobs
                and world.knobs[k].device_id not in lost]
        return wanted, back

    async def _actuate(self, world: World, knobs: dict[str, KnobValue], lost: set[str], t_wall: float,
                       hop_ok: bool) -> list[Event]:
        wanted, back = self.arbitrate(world, lost)
        inline = [w for w in wanted if w.backend in world.inline]
        threaded = [w for w in wanted if w.backend not in world.inline]
        back_inline = [b for b in back if world.owner[b] in world.inline]
        events, after = self._apply(world, inline, back_inline, knobs, t_wall)
        knobs.update(after)
        back_threaded = [b for b in back if world.owner[b] not in world.inline]
        if hop_ok and (threaded or back_threaded):
            result = await self._hop(self._apply, world, threaded, back_threaded, dict(knobs), t_wall)
            if result is not None:
                events += result[0]
                knobs.update(result[1])
        return events

    def _apply(self, world: World, wanted: list[Wanted], back: list[str], knobs: Mapping[str, KnobValue],
               t_wall: float) -> tuple[list[Event], dict[str, KnobValue]]:
        """Hand back, then write; returns the events and the knobs' values read back afterwards."""
        events: list[Event] = []
        after: dict[str, KnobValue] = {}
        for knob_id in back:
            events += self.applier.give_back(world.owner[knob_id], world.knobs[knob_id], t_wall)
            try:
                after[knob_id] = world.owner[knob_id].read_knob(knob_id)
            except Exception:  # noqa: BLE001 - the next sample tells
                pass
        for w in wanted:
            knob = world.knobs[w.knob_id]
            value, ev = self.applier.apply(w.backend, knob, knob.device_id, w.decision, w.value,
                                           knobs.get(w.knob_id), t_wall)
            if value is not None:
                after[w.knob_id] = value
            events += ev
        return events, after

    # -- the worker thread -----------------------------------------------------------------------------
    async def _hop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the worker thread; None when the worker is still busy with an earlier hop, or
        this one took longer than :attr:`hop_budget_s` (it finishes in the background; a hung NVML call
        never stalls the loop by more than the budget)."""
        if self._busy is not None and not self._busy.done():
            return None
        future = asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.hop_budget_s)
        except TimeoutError:
            self._busy = future
            future.add_done_callback(_retrieve)
            return None

    async def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for a hop still running in the background, so that a late write
        cannot land after the final restore."""
        if self._busy is not None and not self._busy.done():
            await asyncio.wait({self._busy}, timeout=timeout_s)

    def _unanswered(self, threaded: tuple[Backend, ...], t_wall: float, events: list[Event]) -> list[Sample]:
        """Samples for threaded backends that did not answer: every channel failed (fans to full)."""
        why = f"no answer within {self.hop_budget_s:g} s"
        if not self._hop_faulted:
            self._hop_faulted = True
            events.append(self._fault(t_wall, ",".join(getattr(b, "kind", "?") for b in threaded) or "worker",
                                      f"worker thread busy: {why}"))
        t = self.clock.monotonic()
        return [Sample(t, {c: Reading(c, None, Status.FAILED, why) for c in self._channels.get(id(b), ())})
                for b in threaded]

    def _fault(self, t_wall: float, subject: str, message: str, **data: Any) -> Event:
        self._log.error("fault", subject=subject, message=message, **data)
        return Event("fault", t_wall, subject, message, data)
