"""One tick: sample → health → evaluate → arbitrate → actuate → publish.

- **Sample** (:mod:`aithermd.runtime.sampling`): inline backends on the event loop, threaded ones (NVML) in
  one hop to the worker thread.
- **Health** (:mod:`aithermd.runtime.health`): failed, implausible and stale readings and lost devices are
  marked degraded and reported once; a lost device's knobs are skipped; no device fault ends the daemon.
- **Evaluate**: the pure policy engine with the active policy, the holds and the operator's overrides.
- **Arbitrate**: the engine's winning decision per knob, clamped again to the knob's constraints; a knob we
  own that no decision claims any more (or a ``default`` decision) is handed back (journaled original
  restored); no-ops are dropped by the applier.
- **Actuate**: journal first, write, read back (:mod:`aithermd.actuate.applier`).
- **Publish**: one frozen :class:`~aithermd.model.Snapshot` and the tick's events to the StateHub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.actuate.applier import Applier
from aithermd.actuate.worker import Worker
from aithermd.backends.base import Backend
from aithermd.clock import Clock
from aithermd.model import Decision, Event, KnobValue, Layer, PolicyStatus, Snapshot
from aithermd.publish.hub import StateHub
from aithermd.runtime.health import Health, fault
from aithermd.runtime.sampling import Sampler, list_processes
from aithermd.runtime.world import Engine, World


@dataclass(frozen=True)
class Wanted:
    backend: Backend
    knob_id: str
    decision: Decision
    value: float


class Tick:
    """The tick's pipeline over a :class:`World` (swap ``world`` between ticks to reload). ``lock`` is held
    for a whole tick; whatever writes between ticks takes it too."""

    def __init__(self, world: World, *, applier: Applier, control: Any, hub: StateHub, engine: Engine,
                 clock: Clock, worker: Worker, tick_s: float, dry_run: bool,
                 before_sample: Callable[[float], None] | None = None,
                 processes: Callable[[], Any] = list_processes) -> None:
        self.applier, self.control, self.hub, self.engine = applier, control, hub, engine
        self.clock, self.worker, self.tick_s, self.dry_run = clock, worker, tick_s, dry_run
        self.before_sample = before_sample
        self.lock = asyncio.Lock()
        self.sampler = Sampler(clock, worker, processes)
        self.health = Health()
        self.state: Any = engine.initial_state()
        self.decisions: Mapping[str, Decision] = {}
        self.states: Mapping[str, Mapping[str, str]] = {}
        self.world = world
        self._log = structlog.get_logger("aithermd.tick")

    # -- one tick --------------------------------------------------------------------------------------
    async def run(self, seq: int) -> Snapshot:
        """Run tick ``seq`` and publish its snapshot (also returned)."""
        world = self.world
        t_mono, t_wall = self.clock.monotonic(), self.clock.wall()
        if self.before_sample is not None:
            self.before_sample(t_mono)
        sampled = await self.sampler.sample(world, t_wall)
        events = sampled.events
        readings, knobs, lost = sampled.readings, sampled.knobs, sampled.lost
        degraded = self.health.check(readings, knobs, lost, t_wall, events)
        for knob_id in self.applier.owned:
            knob = world.knobs.get(knob_id)
            if knob is not None and knob.device_id not in lost:
                events += self.applier.observe(knob, knobs.get(knob_id), t_mono, t_wall)
        events += self.control.expire(t_wall)
        decided = self._evaluate(world, t_mono, t_wall, readings, knobs, sampled.attrs, sampled.processes,
                                 events)
        if decided:
            events += await self._actuate(world, knobs, lost, t_wall, sampled.hop_ok)
        degraded.update(self.applier.faults)
        degraded.update(self.applier.stepped_back)
        snapshot = Snapshot(seq=seq, t_mono=t_mono, t_wall=t_wall, devices=world.devices, readings=readings,
                            knobs=knobs, attrs=sampled.attrs, decisions=self.decisions,
                            policy=PolicyStatus(self.control.active, tuple(self.control.holds), self.states),
                            degraded=tuple(sorted(degraded)), dry_run=self.dry_run, tick_s=self.tick_s)
        self.hub.publish(snapshot, events)
        return snapshot

    # -- evaluate --------------------------------------------------------------------------------------
    def _evaluate(self, world: World, t_mono: float, t_wall: float, readings: Mapping[str, Any],
                  knobs: Mapping[str, KnobValue], attrs: Mapping[str, Any], procs: Any,
                  events: list[Event]) -> bool:
        op = self.control
        active = world.policies.get(op.active)
        if active is None:
            events.append(fault(t_wall, op.active, f"policy {op.active} is not loaded"))
            return False
        holds = [world.policies[n] for n in op.hold_names() if n in world.policies]
        try:
            inp = self.engine.input_type(t_mono=t_mono, t_wall=t_wall, devices=world.devices,
                                         readings=readings, knobs=knobs, attrs=attrs, processes=procs)
            result = self.engine.evaluate(active, holds, inp, self.state, op.override_values())
        except Exception as exc:  # noqa: BLE001 - keep the last settings, report, try again next tick
            self._log.exception("engine_failed")
            events.append(fault(t_wall, op.active, f"policy engine failed: {exc}"))
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
            result = await self.worker.hop(self._apply, world, threaded, back_threaded, dict(knobs), t_wall)
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

    async def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for a worker job still running in the background, so that a late
        write cannot land after the final restore."""
        await self.worker.drain(timeout_s)
