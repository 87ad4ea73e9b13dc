"""Living with a real machine: the services beside the control loop and the one lock they share with it.

:class:`Live` belongs to one :class:`~aithermd.runtime.daemon.Daemon` run. It shares the *tick lock*: the
daemon runs each tick through :meth:`Live.tick` (which holds the lock, applies what changed between ticks,
then runs the tick), and every service that writes between ticks — the fast lane, the resume re-apply —
takes the same lock, so no write ever interleaves with a tick. Between ticks it applies:

- **hotplug** (:mod:`aithermd.watchers.hotplug`): rediscovers the families whose udev events settled and
  swaps the new world in;
- **sleep** (:mod:`aithermd.watchers.logind`): on PrepareForSleep(true) the applier is paused (no write,
  no hand-back, no drift count: a driver resetting knobs on resume is not a conflict) and the writes in
  flight are waited for; on PrepareForSleep(false), or when no resume comes
  within ``max_pause_s`` of awake time, every owned knob is re-applied to the last decision and read back,
  and one ``sleep`` event says what was rewritten, found in place or did not stick;
- **fast lane** (:mod:`aithermd.watchers.fastlane`): re-armed after every tick from the published snapshot.

Events of these services ride on the next snapshot: the cycle publishes through a hub that prepends them.
:class:`LiveOptions` says which services run; :meth:`LiveOptions.for_daemon` enables them for a real
machine (``/sys``, real time) and leaves them off for fixture trees and simulated clocks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from aithermd.actuate.applier import same_setting
from aithermd.model import Event, Layer, Snapshot
from aithermd.runtime.changes import rediscover
from aithermd.watchers.fastlane import FastLane, FastLaneOptions
from aithermd.watchers.hotplug import Hotplug, UdevMonitor


@dataclass(frozen=True)
class LiveOptions:
    """``hotplug``: apply device events between ticks; ``udev``: take them from a udev monitor (False: only
    from ``Live.hotplug.submit()``); ``sleep_bus``: ``"system"`` or a D-Bus address where logind is
    watched (None: not watched); ``inhibit``: hold a delay inhibitor lock; ``fastlane``: its options (None:
    off); ``settle_s``: quiet time before hotplug events are applied (s); ``max_pause_s``: awake time after
    PrepareForSleep(true) after which writing resumes anyway (s); ``resume_timeout_s``: longest wait for the
    NVML knobs' re-apply on resume (s)."""

    hotplug: bool = False
    udev: bool = True
    sleep_bus: str | None = None
    inhibit: bool = True
    fastlane: FastLaneOptions | None = None
    settle_s: float = 0.2
    max_pause_s: float = 120.0
    resume_timeout_s: float = 10.0

    @classmethod
    def for_daemon(cls, settings: Any, real_time: bool, *, machine_sysfs: str = "/sys") -> LiveOptions:
        """On for a real machine in real time: hotplug when the sysfs root is the machine's own
        (``machine_sysfs``); logind on the daemon's bus address when it is one, else on the system bus when
        the daemon serves there or drives the machine's own sysfs (``--bus none``/``session`` choose where
        to serve, not whether the machine suspends); the fast lane when the tick is slower than 10 Hz."""
        if not real_time:
            return cls()
        on_sys = Path(settings.sysfs_root).resolve() == Path(machine_sysfs)
        bus = (settings.bus if "=" in settings.bus
               else "system" if settings.bus == "system" or on_sys else None)
        fast = FastLaneOptions(threaded=True) if settings.tick_s > 0.1 else None
        return cls(hotplug=on_sys, sleep_bus=bus, fastlane=fast)


class _Hub:
    """The cycle's hub: publishes through the daemon's hub with the services' queued events first."""

    def __init__(self, real: Any, live: Live) -> None:
        self.real, self.live = real, live

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def publish(self, snapshot: Snapshot, events: Sequence[Event] = ()) -> None:
        queued, self.live.queued = self.live.queued, []
        self.real.publish(snapshot, [*queued, *events] if queued else events)


class Live:
    """The services of one daemon run (see the module doc). ``daemon`` gives ``cycle``, ``hub``,
    ``clock`` and ``settings``."""

    def __init__(self, daemon: Any, options: LiveOptions) -> None:
        self.daemon, self.options = daemon, options
        self.tick_lock = daemon.tick.lock
        self.queued: list[Event] = []
        self.paused_since: float | None = None
        self.fastlane: FastLane | None = None
        self._fast_thread: threading.Thread | None = None
        self.hotplug: Hotplug | None = None
        self.sleep: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._unlisten: Any = None
        self._log = structlog.get_logger("aithermd.live")

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    def emit(self, events: Sequence[Event]) -> None:
        self.queued.extend(events)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        d, o = self.daemon, self.options
        d.tick.hub = _Hub(d.tick.hub, self)
        if o.fastlane is not None:
            self.fastlane = FastLane(lambda: self.daemon.tick, self.tick_lock, self.emit, o.fastlane,
                                     clock=d.clock, paused=lambda: self.paused)
            self._unlisten = d.hub.add_listener(self.fastlane.rearm)
            if o.fastlane.threaded:
                self._fast_thread = self.fastlane.start_thread(asyncio.get_running_loop())
            else:
                self._tasks.append(asyncio.create_task(self.fastlane.run()))
        if o.hotplug:
            self.hotplug = Hotplug(monitor_factory=UdevMonitor if o.udev else None, settle_s=o.settle_s,
                                   clock=d.clock)
            try:
                await self.hotplug.start()
            except Exception as exc:  # noqa: BLE001 - the daemon runs on without hotplug
                self._log.warning("hotplug_unavailable", error=f"{type(exc).__name__}: {exc}")
                self.hotplug = None
        if o.sleep_bus is not None:
            from aithermd.watchers.logind import LogindWatcher

            self.sleep = LogindWatcher(o.sleep_bus, self.suspend, self.resume, inhibit=o.inhibit)
            await self.sleep.start()

    async def stop(self) -> None:
        """Stop every service (before the daemon's final restore: nothing writes after this returns)."""
        if self.fastlane is not None:
            self.fastlane.stop()
        if self._fast_thread is not None:  # it only waits on the loop for a hand-off: gone within a period
            await asyncio.to_thread(self._fast_thread.join, 2.0)
            self._fast_thread = None
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for service in (self.hotplug, self.sleep):
            if service is not None:
                try:
                    await service.stop()
                except Exception as exc:  # noqa: BLE001 - stopping goes on
                    self._log.warning("service_stop_failed", error=f"{type(exc).__name__}: {exc}")
        if self.paused:  # the final restore writes, paused or not
            self.daemon.tick.applier.resume()
            self.paused_since = None

    # -- the tick --------------------------------------------------------------------------------------
    async def tick(self, seq: int) -> Snapshot:
        """Apply what changed between ticks, then run the cycle's tick ``seq``, all under the tick lock."""
        async with self.tick_lock:
            d = self.daemon
            paused_s = None if self.paused_since is None else d.clock.monotonic() - self.paused_since
            if paused_s is not None and paused_s > self.options.max_pause_s:
                self._log.warning("resume_assumed", paused_s=round(paused_s, 1),
                                  message="no PrepareForSleep(false): writing again")
                await self._resume_locked("no resume announced")
            if self.hotplug is not None:
                self.hotplug.check()
                families = self.hotplug.due()
                if families:
                    await self._rediscover(families)
            return await d.tick.run(seq)

    async def _rediscover(self, families: set[str]) -> None:
        d = self.daemon
        tick = d.tick
        world, events = await rediscover(tick.world, families, applier=tick.applier,
                                         t_wall=d.clock.wall())
        if world is not tick.world:
            tick.world = world
        self.emit(events)

    # -- suspend and resume ----------------------------------------------------------------------------
    async def suspend(self) -> None:
        """Stop writing: the applier is paused after the tick in flight, writes in flight are waited for."""
        d = self.daemon
        async with self.tick_lock:
            if self.paused:
                return
            d.tick.applier.pause()
            self.paused_since = d.clock.monotonic()
            await d.tick.executor.settle(5.0)
        self._log.info("suspend", message="writes paused until resume")
        self.emit([Event("sleep", d.clock.wall(), "system", "suspending: writes paused until resume",
                         {"action": "suspend"})])

    async def resume(self) -> None:
        async with self.tick_lock:
            await self._resume_locked("resumed")

    async def _resume_locked(self, why: str) -> None:
        d = self.daemon
        tick = d.tick
        applier = tick.applier
        applier.resume()
        self.paused_since = None
        world, t_wall = tick.world, d.clock.wall()
        if applier.dry_run:
            self.emit([Event("sleep", t_wall, "system", f"{why}: dry-run, nothing to re-apply",
                             {"action": "resume"})])
            return
        wanted = [(k, dec) for k, dec in tick.decisions.items()
                  if k in applier.owned and k in world.knobs and dec.value is not None
                  and dec.layer != Layer.DEFAULT and k not in applier.stepped_back]
        applied = await tick.executor.apply(world, wanted, t_wall=t_wall,
                                            budget_s=self.options.resume_timeout_s)
        if applied.late:  # the next tick writes them
            self._log.warning("resume_nvml_late", knobs=applied.late)
        rewritten, in_place, failed = [], [], []
        for r in applied.results:
            knob = world.knobs[r.knob_id]
            if not same_setting(knob, r.after, r.value):
                failed.append(r.knob_id)
            elif same_setting(knob, r.before, r.value):
                in_place.append(r.knob_id)
            else:
                rewritten.append(r.knob_id)
        message = (f"{why}: {len(rewritten)} setting(s) re-applied, {len(in_place)} found in place, "
                   f"{len(failed)} did not stick")
        self._log.info("resume", rewritten=rewritten, in_place=in_place, failed=failed)
        self.emit([Event("sleep", t_wall, "system", message, {"action": "resume", "rewritten": rewritten,
                                                              "in_place": in_place, "failed": failed}),
                   *applied.events])
