"""One tick: changes → sample → health → evaluate → arbitrate → actuate → publish.

- **Changes** (:mod:`aithermd.runtime.changes`): what was posted to the inbox since the last tick — a
  reload, rediscovered devices, a resume — is applied first, under the tick lock.

- **Sample** (:mod:`aithermd.runtime.sampling`): every backend in one pass in the read guard's thread:
  the inline ones under its deadline (a hung read quarantines its device), then the threaded ones (NVML,
  a deadline per GPU on its own worker) under the worker's budget.
- **Health** (:mod:`aithermd.runtime.health`): each reading judged by the sensor trust (a transient fault
  or a spike held for one reading within 3 s); failed, implausible and stale readings and lost devices are
  marked degraded and reported once; a lost device's knobs are skipped; no device fault ends the daemon.
  A device the read guard holds as hung is not written (:mod:`aithermd.actuate.hung`): its owned and decided
  knobs carry an ``uncontrollable`` alarm until it answers again.
  GPU power limits enforced below the requested one, or a draw above the enforced limit, are reported
  (:mod:`aithermd.actuate.caps`; such a limit is written again once).
  Fans under duty that do not turn are kicked, then called stalled (:mod:`aithermd.runtime.fanwatch`): the
  safety layer gets their actions through ``EngineInput.fan_alarms``.
- **Evaluate**: the pure policy engine with the active policy, the holds and the operator's overrides.
- **Arbitrate**: the engine's winning decision per knob, clamped again to the knob's constraints; a knob we
  own that no decision claims any more (or a ``default`` decision) is handed back (journaled original
  restored); no-ops are dropped by the applier.
- **Actuate**: through the one apply path (:mod:`aithermd.actuate.execute`): clamp, journal first, write,
  read back; the threaded backends' knobs in one hop to the worker thread.
- **Publish**: one frozen :class:`~aithermd.model.Snapshot` and the tick's events to the StateHub; a GPU
  the engine found held high while idle carries ``held_idle`` in its attrs (status, TUI, metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from aithermd.actuate.applier import Applier
from aithermd.actuate.caps import PowerCaps
from aithermd.actuate.execute import Executor
from aithermd.clock import Clock
from aithermd.model import EMPTY, Alarm, Decision, Event, KnobValue, Layer, PolicyStatus, Snapshot
from aithermd.policy.explain import Lazy, eager_items
from aithermd.publish.hub import StateHub
from aithermd.runtime.changes import Changes
from aithermd.runtime.fanwatch import FanWatch
from aithermd.runtime.health import Health, fault
from aithermd.runtime.localzone import LocalZone
from aithermd.runtime.sampling import Sampler, list_processes
from aithermd.runtime.world import Engine, World


def with_held_idle(attrs: Mapping[str, Mapping[str, Any]], held: Mapping[str, Any],
                   t_mono: float) -> Mapping[str, Mapping[str, Any]]:
    """``attrs`` with ``held_idle`` ({"for_s", "power_w", "floor_w", "excess_w", "floor", "held_w",
    "recovered_w", "pstate"}) on each GPU held high while idle."""
    if not held:
        return attrs
    out = dict(attrs)
    for gpu, h in held.items():
        out[gpu] = {**out.get(gpu, {}), "held_idle": {
            "for_s": round(t_mono - h.since, 1), "power_w": round(h.power_w, 1),
            "floor_w": round(h.floor_w, 1), "excess_w": round(h.excess_w, 1),
            "floor": "learned" if h.learned else "assumed", "held_w": round(h.held_w, 1),
            "recovered_w": round(h.recovered_w, 1),
            "pstate": h.pstate}}
    return out


class Tick:
    """The tick's pipeline over a :class:`World`. ``changes`` applies the inbox at the start of each tick
    (None: no inbox, the world stays as built); ``lock`` is held for a whole tick, and whatever writes
    between ticks (the fast lane) takes it too."""

    def __init__(self, world: World, *, executor: Executor, control: Any, hub: StateHub, engine: Engine,
                 clock: Clock, tick_s: float, dry_run: bool,
                 before_sample: Callable[[float], None] | None = None,
                 processes: Callable[[], Any] = list_processes, changes: Changes | None = None) -> None:
        self.executor, self.control, self.hub, self.engine = executor, control, hub, engine
        self.clock, self.tick_s, self.dry_run = clock, tick_s, dry_run
        self.before_sample = before_sample
        self.changes = changes
        self.lock = asyncio.Lock()
        self.sampler = Sampler(clock, executor.worker, processes)
        self.health = Health()
        self.caps = PowerCaps()
        self.fanwatch = FanWatch()
        self.state: Any = engine.initial_state()
        self.decisions: Mapping[str, Decision] = {}
        self.states: Mapping[str, Mapping[str, str]] = {}
        self.budget: Mapping[str, Any] = {}
        self.held_idle: Mapping[str, Any] = {}  # GPUs held high while idle (aithermd.policy.held)
        self.zone = LocalZone()  # timezone: local follows timedatectl set-timezone (a look a minute)
        self.world = world
        self._applies = 0  # Executor.applies when the reads were taken ahead
        self._log = structlog.get_logger("aithermd.tick")

    @property
    def applier(self) -> Applier:
        return self.executor.applier

    # -- one tick --------------------------------------------------------------------------------------
    def ahead(self, at: float, after: Callable[[], None]) -> float | None:
        """Have the next tick's reads taken at monotonic ``at`` (s) by the read guard's thread, which calls
        ``after()`` once they are over (:meth:`Sampler.ahead`); how long past ``at`` they may take (s), or
        None when not taken ahead (a simulated machine stepped before each sample, a tick running)."""
        if self.before_sample is not None or self.lock.locked():
            return None
        self._applies = self.executor.applies  # a write before the tick (a resume, the fast lane): read anew
        return self.sampler.ahead(self.world, at, after)

    async def run(self, seq: int) -> Snapshot:
        """Run tick ``seq`` under the tick lock and publish its snapshot (also returned)."""
        async with self.lock:
            first: list[Event] = []
            if self.changes is not None and (drained := self.changes.take()):
                self.world, first = await self.changes.apply(self.world, self.decisions, drained)
            if self.executor.applies != self._applies:
                self.sampler.forget()
            return await self._run(seq, first)

    async def _run(self, seq: int, first: list[Event]) -> Snapshot:
        world = self.world
        t_mono, t_wall = self.clock.monotonic(), self.clock.wall()
        if t_mono >= self.zone.due:
            self.zone.check(t_mono)
        if self.before_sample is not None:
            self.before_sample(t_mono)
        sampled = await self.sampler.sample(world, t_wall)
        events = [*first, *sampled.events] if first else sampled.events
        knobs, lost = sampled.knobs, sampled.lost
        unanswered = self.executor.unanswered  # a chip whose reads hang is not written either (W2)
        hung = self.sampler.hung(world)
        if hung or unanswered.devices:
            events += self.executor.hold(world, hung, t_wall, t_mono)  # and a full-duty try for its fans
        readings = self.health.trust(world.devices, t_mono, sampled.readings)
        degraded = self.health.check(readings, knobs, lost, t_wall, events)
        applier = self.applier  # a property: looked up once a tick, not once per knob
        events += self.fanwatch.check(world.devices, readings, knobs, t_mono, t_wall, paused=applier.paused)
        for knob_id in applier.owned:
            knob = world.knobs.get(knob_id)
            if knob is not None and knob.device_id not in lost:
                events += applier.observe(knob, knobs.get(knob_id), t_mono, t_wall)
        capped, reapply = self.caps.observe(world, readings, knobs, applier.requested, t_mono, t_wall)
        events += capped
        events += self.control.expire(t_wall)
        progress = getattr(self.control, "progress_readings", None)  # jobs' own progress rates (D-Bus)
        if progress is not None and (rates := progress(t_mono)):
            readings = {**readings, **rates}
        decided = self._evaluate(world, t_mono, t_wall, readings, knobs, sampled.attrs, sampled.processes,
                                 events)
        if decided:
            events += await self._actuate(world, knobs, lost, t_wall, sampled.hop_ok, reapply)
        degraded.update(applier.faults)
        degraded.update(applier.stepped_back)
        alarms: dict[str, Alarm] = {**self.fanwatch.alarms, **applier.alarms}
        if unanswered.devices:
            alarms.update(unanswered.alarms(world.knobs, (*applier.owned, *self.decisions)))
        if alarms:  # no generator made on a tick without alarms
            degraded.update(k for k, a in alarms.items() if a.kind != "empty")
        snapshot = Snapshot(seq=seq, t_mono=t_mono, t_wall=t_wall, devices=world.devices, readings=readings,
                            knobs=knobs, attrs=with_held_idle(sampled.attrs, self.held_idle, t_mono),
                            decisions=self.decisions,
                            policy=PolicyStatus(self.control.active, tuple(self.control.holds), self.states),
                            degraded=tuple(sorted(degraded)), dry_run=self.dry_run, tick_s=self.tick_s,
                            health={**sampled.health, "power_limits": self.caps.state}
                            if self.caps.state else sampled.health, budget=self.budget, alarms=alarms)
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
        names = op.hold_names()
        holds = [world.policies[n] for n in names if n in world.policies] if names else []
        try:
            inp = self.engine.input_type(t_mono=t_mono, t_wall=t_wall, devices=world.devices,
                                         readings=readings, knobs=knobs, attrs=attrs, processes=procs,
                                         fan_alarms=self.fanwatch.actions)
            result = self.engine.evaluate(active, holds, inp, self.state, op.override_values())
        except Exception as exc:  # noqa: BLE001 - keep the last settings, report, try again next tick
            self._log.exception("engine_failed")
            events.append(fault(t_wall, op.active, f"policy engine failed: {exc}"))
            return False
        self.state = result.state
        if result.decisions is not self.decisions:  # the engine hands back the very mapping when unchanged
            self._log_sources(self.decisions, result.decisions)
        self.decisions = result.decisions  # read-only (a MappingProxyType): kept, not copied, so that the
        # snapshot's consumers may tell an unchanged tick by identity
        self.states = result.states
        self.budget = getattr(result, "budget", None) or {}
        self.held_idle = getattr(result, "held_idle", {})
        return True

    def _log_sources(self, old: Mapping[str, Decision], new: Mapping[str, Decision]) -> None:
        """Log each fan curve whose source channels (``used:<curve>`` of its decision) changed. Reads only
        what is there without building a decision's inputs (:func:`aithermd.policy.explain.eager_items`)."""
        for knob_id, d in new.items():
            prev = old.get(knob_id)
            if prev is d:
                continue
            before = EMPTY
            if prev is not None:
                before = prev.inputs.eager if type(prev.inputs) is Lazy else eager_items(prev.inputs)
            for k, v in (d.inputs.eager if type(d.inputs) is Lazy else eager_items(d.inputs)).items():
                if k.startswith("used:") and before.get(k) != v:
                    self._log.info("source_in_use", knob=knob_id, curve=k[5:], channels=v,
                                   before=before.get(k) if prev is not None else None)

    # -- arbitrate and actuate -------------------------------------------------------------------------
    def arbitrate(self, world: World, lost: set[str]) -> tuple[list[tuple[str, Decision]], list[str]]:
        """The decisions this tick wants written (knob id, decision), and the owned knobs to hand back."""
        wanted: list[tuple[str, Decision]] = []
        claimed: set[str] = set()
        for knob_id, d in self.decisions.items():
            knob = world.knobs.get(knob_id)
            if knob is None or knob.device_id in lost or d.value is None or d.layer == Layer.DEFAULT:
                continue
            claimed.add(knob_id)
            wanted.append((knob_id, d))
        owned = self.applier.owned
        back = [k for k in owned if k not in claimed and k in world.knobs
                and world.knobs[k].device_id not in lost] if not owned <= claimed else []
        return wanted, back

    async def _actuate(self, world: World, knobs: dict[str, KnobValue], lost: set[str], t_wall: float,
                       hop_ok: bool, force: set[str]) -> list[Event]:
        wanted, back = self.arbitrate(world, lost)
        applied = await self.executor.apply(world, wanted, back=back, current=knobs, t_wall=t_wall,
                                            threaded=hop_ok, force=force)
        knobs.update(applied.after)
        return applied.events
