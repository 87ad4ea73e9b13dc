"""The daemon's lifecycle, the one place that knows the order of things:
build → start the services → tick on the deadlines → stop the services in reverse → restore.

- **Build**: take the instance locks (one daemon per machine: :mod:`aithermd.runtime.instance`; a second
  one exits 1 before it reads anything), open the journal (a dirty one — a crash — is restored first),
  open the backends and discover their devices (:mod:`aithermd.backends.registry`), load the policies (a
  broken file beside the active policy is left out and logged; a broken active policy, or none to run,
  stops the start: exit 78 EX_CONFIG, nothing written), pick the active policy (``--policy`` > the choice
  kept in the state directory > the config), then the apply path (:mod:`aithermd.actuate.execute`), the
  inbox and the tick.
- **Start** (:mod:`aithermd.runtime.services`, in this order, each within a timeout; one that cannot start
  is a warning): the sd_notify watchdog, energy accounting, D-Bus, the Prometheus exporter (built and served
  right after the first tick, fed what it missed), then the watchers: udev hotplug, logind, the fast lane.
- **Run**: the :class:`~aithermd.runtime.scheduler.Scheduler` runs one :class:`~aithermd.runtime.tick.Tick`
  per deadline; ``READY=1`` after the first. Whatever happens between ticks (SIGHUP or D-Bus reload,
  hotplug, suspend and resume, the fast lane's events) is posted to the inbox the tick drains at its start.
- **Stop** (SIGTERM/SIGINT, ``request_stop()``, ``max_ticks``, ``until``): the services stop in reverse
  order (the watchers first: nothing writes between ticks any more), the apply path waits for the writes in
  flight, every journaled knob is restored and the journal cleared (exit 1 when a knob could not be).

Signal handlers only set an event or post to the inbox (:mod:`aithermd.runtime.signals`). For the
simulator and tests every piece can be injected: ``clock`` (monotonic + wall), ``backends`` (else opened
from the settings), ``sleep`` (advances a simulated clock), ``before_sample(t_mono)`` (steps the physics
before each sample), ``hub``, ``engine``, ``environ`` (for ``NOTIFY_SOCKET``), ``watchers`` (which run;
default :meth:`~aithermd.watchers.options.WatcherOptions.for_daemon`), ``processes`` (the process table
energy is attributed over) and ``stop_timeout_s`` (each wait of the stop).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd.accounting.service import EnergyService
from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal, JournalError
from aithermd.actuate.restore import restore_at_start
from aithermd.actuate.worker import Worker
from aithermd.backends.base import Backend
from aithermd.backends.nvml_life import bus_id_of
from aithermd.backends.registry import changed_families, discover, open_for_daemon
from aithermd.clock import Clock, RealClock
from aithermd.errors import EXIT_CONFIG, InvalidArgument, PolicyErrors
from aithermd.fans.store import fan_config
from aithermd.model import Snapshot
from aithermd.publish.hub import StateHub
from aithermd.runtime.changes import Changes
from aithermd.runtime.control import Control
from aithermd.runtime.inbox import Inbox, Message, Rediscover, Release, Reload, Unrelease
from aithermd.runtime.instance import AlreadyRunning, InstanceLock
from aithermd.runtime.scheduler import Scheduler, Sleep
from aithermd.runtime.sd_notify import Notifier
from aithermd.runtime.services import (
    DbusService,
    EnergyListener,
    MetricsService,
    Service,
    ServiceGroup,
    Watchdog,
)
from aithermd.runtime.signals import Signals
from aithermd.runtime.tick import Tick
from aithermd.runtime.world import Engine, PolicySet, World, load_policies_at_start
from aithermd.settings import DaemonSettings
from aithermd.watchers.fastlane import FastLane
from aithermd.watchers.hotplug import Hotplug, UdevMonitor
from aithermd.watchers.options import WatcherOptions

STOP_TIMEOUT_S = 5.0


def _guard(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn`` and swallow its failure (logging or notify on the way out)."""
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        pass


class Daemon:
    """One daemon run. ``await run()`` returns the exit code (0 clean, 78 EX_CONFIG an invalid policy set or
    a missing active policy at start, 1 another start failure or a knob that could not be restored).
    ``hub`` holds the published snapshots; ``control`` the DaemonControl;
    ``services`` the services that started; ``hotplug``, ``logind``, ``fastlane`` the watchers that run."""

    def __init__(self, settings: DaemonSettings, *, clock: Clock | None = None,
                 backends: Sequence[Backend] | None = None, sleep: Sleep = asyncio.sleep,
                 before_sample: Callable[[float], None] | None = None, hub: StateHub | None = None,
                 engine: Engine | None = None, environ: Mapping[str, str] | None = None,
                 watchers: WatcherOptions | None = None, processes: Any = None,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.settings = settings
        self.clock = clock or RealClock()
        self.hub = hub or StateHub()
        self.sleep = sleep
        self.before_sample = before_sample
        self.watcher_options = watchers
        self.stop_timeout_s = stop_timeout_s
        self._injected = list(backends) if backends is not None else None
        self._processes = processes
        self._engine = engine
        self._environ = environ
        self._log = structlog.get_logger("aithermd.daemon")
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self.inbox = Inbox()
        self.services = ServiceGroup(stop_timeout_s=stop_timeout_s)
        self.control: Control | None = None
        self.changes: Changes | None = None
        self.tick: Tick | None = None
        self.scheduler: Scheduler | None = None
        self.notifier: Notifier | None = None
        self.energy: EnergyService | None = None
        self.hotplug: Hotplug | None = None
        self.logind: Any = None
        self.fastlane: FastLane | None = None
        self._last_tick_done: float | None = None
        self.not_restored: dict[str, str] = {}  # knob id → why it was not put back by the stop's restore

    # -- requests (safe from signal handlers: they only set an event or post) ----------------------------
    def request_stop(self) -> None:
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    def request_reload(self) -> None:
        """Reload the policies at the next tick's start (off the loop; SIGHUP)."""
        self.inbox.post(Reload())

    @property
    def world(self) -> World | None:
        return self.tick.world if self.tick is not None else None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine.default()
        return self._engine

    def _policies(self) -> PolicySet:
        """The newest policy set: one loaded and waiting for the next tick, else the running one."""
        assert self.tick is not None and self.changes is not None
        return self.changes.newest or self.tick.world.policy_set

    def reload_now(self) -> None:
        """Load the policies aside and post them for the next tick (D-Bus ``Reload``: blocking, called off
        the loop). Raises PolicyErrors, each error logged as FILE:LINE (the old policies stay)."""
        if self.tick is None or self.changes is None:
            raise RuntimeError("the daemon is not running")
        self.changes.reload(self.tick.world.policy_set)

    async def run_until(self, stop_condition: Callable[[Snapshot], bool],
                        max_ticks: int | None = None) -> int:
        """Run until ``stop_condition(latest snapshot)`` is true after a tick (or ``max_ticks``)."""
        return await self.run(max_ticks=max_ticks, until=lambda: self.hub.latest is not None
                              and stop_condition(self.hub.latest))

    # -- lifecycle -------------------------------------------------------------------------------------
    async def run(self, *, max_ticks: int | None = None, until: Callable[[], bool] | None = None,
                  handle_signals: bool | Signals = False) -> int:
        """Run the daemon; returns the exit code. ``handle_signals``: SIGTERM/SIGINT stop it and SIGHUP
        reloads, from the first line of this call (a :class:`~aithermd.runtime.signals.Signals` caught
        earlier also hands over what arrived before)."""
        self._stop = asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        signals = (handle_signals if isinstance(handle_signals, Signals)
                   else Signals() if handle_signals else None)
        if signals is not None:
            signals.attach(asyncio.get_running_loop(), self.request_stop, self.request_reload)
        try:
            return await self._run(max_ticks, until)
        finally:
            if signals is not None:
                signals.detach()

    async def _run(self, max_ticks: int | None, until: Callable[[], bool] | None) -> int:
        lock = InstanceLock(self.settings.state_dir, self.settings.sysfs_root, self.settings.runtime_dir)
        try:
            lock.acquire()  # before the journal: a second daemon must not "restore" the first one's knobs
        except (AlreadyRunning, OSError) as exc:
            self._log.error("already_running" if isinstance(exc, AlreadyRunning) else "lock_failed",
                            error=str(exc))
            return 1
        try:
            return await self._run_locked(max_ticks, until)
        finally:
            lock.release()

    async def _run_locked(self, max_ticks: int | None, until: Callable[[], bool] | None) -> int:
        assert self._stop is not None
        s = self.settings
        try:
            journal = Journal(s.state_dir, quarantine=True)  # one that is no journal is moved aside
        except JournalError as exc:  # unreadable (EIO), or it could not be moved aside
            self._log.error("journal_unreadable", error=str(exc))
            return 1
        backends = self._injected if self._injected is not None else open_for_daemon(s)
        own_backends = self._injected is None
        inventory = discover(backends)
        restore_at_start(journal, inventory.owner, inventory.knobs.values(), inventory.backends, s.dry_run)
        try:
            policy_set, skipped = load_policies_at_start(s, self.engine)
        except PolicyErrors as exc:
            for err in exc.errors:
                self._log.error("policy_error", error=str(err))
            self._close(backends, own_backends)
            return EXIT_CONFIG
        world = World(inventory, policy_set, fan_config(s.state_dir, s.names))
        for err in skipped:  # loud, but the daemon runs the valid policies; a reload refuses the file
            self._log.error("policy_skipped", error=str(err), path=err.path, line=err.line,
                            message="not loaded; fix or remove it (a reload refuses it until then)")
        control = self.control = Control(s.state_dir, clock=self.clock, hub=self.hub,
                                         policies=lambda: self._policies().policies,
                                         knobs=lambda: self.tick.world.knobs if self.tick else world.knobs,
                                         reload=self.reload_now, default_policy=s.policy,
                                         pinned=s.policy_pinned, warnings=self._selection_warnings,
                                         release=self._release_gpu)
        code = self._pick_policy(control, world, {Path(err.path).stem for err in skipped})
        if code:
            self._close(backends, own_backends)
            return code
        options = self.watcher_options or WatcherOptions.for_daemon(s, self.sleep is asyncio.sleep)
        worker = Worker(max(s.tick_s, 0.5))
        executor = Executor(Applier(journal, dry_run=s.dry_run), worker)
        self.notifier = Notifier(self._environ)
        self.changes = Changes(s, self.engine, control, executor, self.inbox, self.clock,
                               notifier=self.notifier, max_pause_s=options.max_pause_s,
                               resume_timeout_s=options.resume_timeout_s)
        self.tick = Tick(world, executor=executor, control=control, hub=self.hub, engine=self.engine,
                         clock=self.clock, tick_s=s.tick_s, dry_run=s.dry_run,
                         before_sample=self.before_sample, changes=self.changes)
        self.scheduler = Scheduler(s.tick_s, self.clock, self.sleep, ahead=self.tick.ahead)
        self.energy = EnergyService.for_daemon(s, self.clock, backends, self._processes)
        self._log.info("start", policy=control.active, devices=len(world.devices), knobs=len(world.knobs),
                       tick_s=s.tick_s, dry_run=s.dry_run, state_dir=str(s.state_dir))
        code = 1
        try:
            if not self._stop.is_set():  # a stop during start-up: no service, no tick, straight to restore
                await self.services.start(self._services(options, executor))
                self.inbox.add_source(self._device_changes)
            await self.scheduler.run(self._run_tick, self._stop, max_ticks, until)
            code = 0
        finally:
            code = await self._shut_down(code, executor, backends, own_backends)
        return code

    def _pick_policy(self, control: Control, world: World, broken: set[str]) -> int:
        """The active policy at start: the kept or pinned one, else the configured one. Returns 0, or
        EX_CONFIG when it is among the ``broken`` files left out or there is none to run."""
        s = self.settings
        wanted = control.active if control.active not in broken else None
        if wanted is None or (wanted not in world.policies and s.policy in broken):
            name = control.active if wanted is None else s.policy
            self._log.error("policy_error", error=f"the active policy {name!r} is invalid (above); "
                            "nothing was written")
            return EXIT_CONFIG
        if control.active not in world.policies:
            self._log.warning("kept_policy_missing", policy=control.active, fallback=s.policy)
            if s.policy not in world.policies:
                where = ", ".join(map(str, world.policy_dirs))
                self._log.error("policy_error", error=f"policy {s.policy!r} not found in {where}; "
                                f"known: {', '.join(sorted(world.policies))}")
                return EXIT_CONFIG
            control.active = s.policy
        return 0

    def _selection_warnings(self, policy: Any) -> list[str]:
        return self.changes.selection_warnings(policy, self.tick.world) if self.changes and self.tick else []

    def _services(self, options: WatcherOptions, executor: Executor) -> list[Service]:
        """The services beside the tick, in start order (see the module doc)."""
        s = self.settings
        assert self.tick is not None and self.notifier is not None and self.changes is not None
        out: list[Service] = [Watchdog(self.notifier, self.clock, s.tick_s, lambda: self._last_tick_done),
                              EnergyListener(self.energy, self.hub)]
        if s.bus != "none":
            out.append(DbusService(s, self.control, self.hub, self.clock, self.energy))
        if s.metrics_listen != "none":
            out.append(MetricsService(s.metrics_listen, self.hub, self.energy))
        if options.hotplug:
            self.hotplug = Hotplug(monitor_factory=UdevMonitor if options.udev else None,
                                   settle_s=options.settle_s, clock=self.clock)
            out.append(self.hotplug)
        if options.logind_bus is not None:
            from aithermd.watchers.logind import LogindWatcher

            self.logind = LogindWatcher(options.logind_bus, self.changes.suspend, self.changes.resume,
                                        inhibit=options.inhibit)
            out.append(self.logind)
        if options.fastlane is not None:
            self.fastlane = FastLane(lambda: self.tick, self.tick.lock, self.inbox.post_events,
                                     options.fastlane, clock=self.clock, hub=self.hub,
                                     paused=lambda: executor.applier.paused)
            out.append(self.fastlane)
        return out

    def _device_changes(self) -> list[Message]:
        """The inbox's device source: the families whose udev events settled, and those whose backends
        noticed on their own that their devices changed (NVML adopting a GPU that became ready, dropping one
        no longer enumerated, a knob found read-only); before them, an NVIDIA PCI device udev removed or
        unbound is released (its originals restored), one added or bound back may be adopted again."""
        families = changed_families(self.tick.world.inventory) if self.tick is not None else set()
        out: list[Message] = []
        if self.hotplug is not None:
            families |= self.hotplug.poll()
            for ev in self.hotplug.take_gpu_events():  # a GPU released before its rediscovery
                bus = bus_id_of(ev.sys_path)
                if bus is not None:
                    out.append(Release(bus_id=bus) if ev.action in ("remove", "unbind") else Unrelease(bus))
            self.hub.status["udev"] = {"restarts": self.hotplug.restarts, "rescans": self.hotplug.rescans}
        return out + ([Rediscover(frozenset(families))] if families else [])

    async def _shut_down(self, code: int, executor: Executor, backends: Sequence[Backend], own: bool) -> int:
        """Hardware first: every step is guarded so that nothing (not even a closed stderr) can keep the
        journaled knobs from being restored. Returns the exit code."""
        try:  # the watchers first: nothing writes between ticks any more
            await self.services.stop()
        except Exception as exc:  # noqa: BLE001 - the restore below must run whatever happened
            _guard(self._log.error, "services_stop_failed", error=f"{type(exc).__name__}: {exc}")
        if self.settings.dry_run:
            await executor.close(self.stop_timeout_s)
        else:
            try:  # every write in flight waited for (or abandoned), then every journaled knob restored
                report = await executor.restore_all(backends, self.stop_timeout_s)
            except Exception as exc:  # noqa: BLE001 - JournalError: the journal stays for 'restore'
                code = 1
                _guard(self._log.error, "restore_failed", error=str(exc))
            else:
                if not report.ok or report.kept:
                    code = 1
                self.not_restored = {**report.failed,
                                     **{k: "a write to it may still land" for k in report.kept}}
                _guard(self._log.info, "stop", restored=len(report.restored), failed=dict(report.failed))
        assert self.notifier is not None
        _guard(self.notifier.stopping)
        executor.worker.shutdown()
        if self.tick is not None:
            self.tick.sampler.close()  # the read guard's thread (one stuck in a hung read ends with it)
        self._close(backends, own)
        self.notifier.close()
        return code

    def _close(self, backends: Sequence[Backend], own: bool) -> None:
        if not own:
            return
        for backend in backends:
            try:
                backend.close()
            except Exception as exc:  # noqa: BLE001
                _guard(self._log.warning, "close_failed", backend=getattr(backend, "kind", "?"),
                       error=str(exc))

    async def _release_gpu(self, device_id: str) -> str:
        """D-Bus ``ReleaseGpu``: handled by the next tick (:mod:`aithermd.runtime.release`); returns what was
        done. Raises UnknownKnob, InvalidArgument."""
        if self.tick is None:
            raise InvalidArgument("the daemon is starting: try again")
        message = Release(device_id=device_id)
        await self.inbox.request(message)
        if not message.reply:
            raise InvalidArgument(f"{device_id} was not released: the daemon is stopping")
        if isinstance(message.reply[0], Exception):
            raise message.reply[0]
        return str(message.reply[0])

    async def _run_tick(self, seq: int, deadline: float) -> None:
        assert self.tick is not None and self.notifier is not None and self.changes is not None
        started = time.perf_counter()  # the tick's real duration, also under a simulated clock
        snapshot = await self.tick.run(seq)  # under the tick lock, after the inbox's changes
        self._last_tick_done = self.clock.monotonic()
        self.services.after_tick(time.perf_counter() - started)
        status = (f"policy {snapshot.policy.active}, {len(self.tick.applier.owned)} knobs controlled, "
                  f"{len(snapshot.degraded)} degraded" + (" (dry-run)" if snapshot.dry_run else ""))
        if seq == 1:
            self.notifier.ready(status)
            await self.services.start_late()  # the exporter: after READY=1 (services.MetricsService)
            gc.enable()  # `aithermd run` starts with it off (aithermd.cli.main)
        else:
            self.notifier.status(status)
        self.changes.warn_unmatched(self.tick.world)
