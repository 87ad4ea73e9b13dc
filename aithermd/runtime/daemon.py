"""The daemon's lifecycle: build → start services → run the loop → stop in reverse, with timeouts.

Start: open the journal (a dirty one — a crash — is restored first), discover the backends, load the
policies (a broken policy set stops the start: exit 1, nothing written), pick the active policy
(``--policy`` > the choice kept in the state directory > the config), start the services
(:mod:`~aithermd.runtime.services`: energy, D-Bus, Prometheus; one that cannot start is a warning).
Run: the :class:`~aithermd.runtime.scheduler.Scheduler` runs one :class:`~aithermd.runtime.tick.Tick`
per deadline; ``READY=1`` after the first. Stop (SIGTERM/SIGINT, ``request_stop()``, ``max_ticks``,
``until``): services stop in reverse order, every journaled knob is restored and the journal cleared.

Signal handlers only set an event or a flag; a SIGHUP reload runs at the start of the next tick, off the
event loop, and swaps the new world in only when every policy file is valid.

For the simulator and tests every piece can be injected: ``clock`` (monotonic + wall), ``backends`` (else
opened from the settings), ``sleep`` (advances a simulated clock), ``before_sample(t_mono)`` (steps the
physics before each sample), ``hub``, ``engine``, ``environ`` (for ``NOTIFY_SOCKET``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd.accounting.service import EnergyService
from aithermd.actuate.applier import Applier
from aithermd.actuate.execute import Executor
from aithermd.actuate.journal import Journal, JournalError
from aithermd.actuate.restore import restore_journal
from aithermd.actuate.worker import Worker
from aithermd.backends.base import Backend
from aithermd.backends.registry import discover, open_for_daemon
from aithermd.clock import Clock, RealClock
from aithermd.errors import EXIT_CONFIG, PolicyError, PolicyErrors
from aithermd.model import Snapshot
from aithermd.publish.hub import StateHub
from aithermd.runtime import services
from aithermd.runtime.control import Control
from aithermd.runtime.live import Live, LiveOptions
from aithermd.runtime.scheduler import Scheduler, Sleep
from aithermd.runtime.sd_notify import Notifier
from aithermd.runtime.services import STOP_TIMEOUT_S
from aithermd.runtime.signals import Signals
from aithermd.runtime.tick import Tick
from aithermd.runtime.world import (
    Engine,
    PolicySet,
    World,
    load_policies,
    load_policies_at_start,
    with_policies,
)
from aithermd.settings import DaemonSettings


def _guard(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn`` and swallow its failure (logging or notify on the way out)."""
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        pass


class Daemon:
    """One daemon run. ``await run()`` returns the exit code (0 clean, 78 EX_CONFIG an invalid policy set
    or a missing active policy at start, 1 another start failure or a knob that could not be restored).
    ``hub`` holds the published snapshots; ``control`` the DaemonControl."""

    def __init__(self, settings: DaemonSettings, *, clock: Clock | None = None,
                 backends: Sequence[Backend] | None = None, sleep: Sleep = asyncio.sleep,
                 before_sample: Callable[[float], None] | None = None, hub: StateHub | None = None,
                 engine: Engine | None = None, environ: Mapping[str, str] | None = None,
                 live: LiveOptions | None = None, processes: Any = None,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.settings = settings
        self.stop_timeout_s = stop_timeout_s  # each stop step: services, writes in flight, abandoned writes
        self.live_options = live  # hotplug, logind, fast lane (runtime.live); None: as the settings say
        self.live: Live | None = None
        self.clock = clock or RealClock()
        self.hub = hub or StateHub()
        self.sleep = sleep
        self.before_sample = before_sample
        self._injected = list(backends) if backends is not None else None
        self._processes = processes  # the process table energy is attributed over (None: this machine's)
        self.energy: EnergyService | None = None
        self._engine = engine
        self._environ = environ
        self._log = structlog.get_logger("aithermd.daemon")
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._reload_requested = False
        self._pending: PolicySet | None = None
        self.control: Control | None = None
        self.tick: Tick | None = None
        self.scheduler: Scheduler | None = None
        self.notifier: Notifier | None = None
        self._services: list[tuple[str, Any]] = []
        self._last_tick_done: float | None = None
        self._checked: dict[str, tuple[int, int]] = {}  # policy → (policy, devices) last checked

    # -- requests (safe from signal handlers: they only set flags and events) -------------------------
    def request_stop(self) -> None:
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    def request_reload(self) -> None:
        self._reload_requested = True

    @property
    def world(self) -> World | None:
        return self.tick.world if self.tick is not None else None

    def _policies(self) -> PolicySet:
        """The newest policy set: a reloaded one waiting for the next tick, else the running one."""
        assert self.tick is not None
        return self._pending or self.tick.world.policy_set

    def reload_now(self) -> None:
        """Load the policies aside; the new set is swapped in at the next tick. Raises PolicyErrors and
        logs each error as FILE:LINE (the old policies stay)."""
        if self.tick is None:
            raise RuntimeError("the daemon is not running")
        if self.notifier is not None:
            self.notifier.reloading()
        try:
            old = self._policies()
            loaded = load_policies(self.settings, self.engine)
            active, fallback = (self.control.active if self.control else None), self.settings.policy
            if active not in loaded.policies and fallback not in loaded.policies:
                # nothing to fall back to: without an active policy nothing (not even safety) would run
                gone = [n for n in dict.fromkeys((active, fallback)) if n is not None]
                where = (getattr(old.policies.get(active), "path", None)
                         or ", ".join(map(str, loaded.dirs)))
                raise PolicyErrors([PolicyError(str(where), f"policy {' and '.join(gone)} would be gone: the "
                                                "daemon would have no policy to run",
                                                hint="put the file back, or first make another policy active "
                                                "(aithermctl policy set NAME)")])
        except PolicyErrors as exc:
            for err in exc.errors:
                self._log.error("reload_failed", error=str(err), path=getattr(err, "path", None),
                                line=getattr(err, "line", None))
            self._log.error("reload_refused", errors=len(exc.errors), message="old policies kept")
            raise
        finally:
            if self.notifier is not None:
                self.notifier.reloaded()
        self._pending = loaded
        self._log.info("reload", policies=sorted(loaded.policies))

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine.default()
        return self._engine

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
        assert self._stop is not None
        s = self.settings
        try:
            journal = Journal(s.state_dir)
        except JournalError as exc:
            self._log.error("journal_unreadable", error=str(exc))
            return 1
        backends = self._injected if self._injected is not None else open_for_daemon(s)
        own_backends = self._injected is None
        found = discover(backends)
        self._restore_dirty(journal, backends)
        try:
            policy_set, skipped = load_policies_at_start(s, self.engine)
        except PolicyErrors as exc:
            for err in exc.errors:
                self._log.error("policy_error", error=str(err))
            self._close(backends, own_backends)
            return EXIT_CONFIG
        world = World(found, policy_set)
        for err in skipped:  # loud, but the daemon runs the valid policies; a reload refuses the file
            self._log.error("policy_skipped", error=str(err), path=err.path, line=err.line,
                            message="not loaded; fix or remove it (a reload refuses it until then)")
        self.control = Control(s.state_dir, clock=self.clock, hub=self.hub,
                               policies=lambda: self._policies().policies,
                               knobs=lambda: self.tick.world.knobs if self.tick else world.knobs,
                               reload=self.reload_now, default_policy=s.policy, pinned=s.policy_pinned,
                               warnings=self.selection_warnings)
        broken = {Path(err.path).stem for err in skipped}
        wanted = self.control.active if self.control.active not in broken else None
        if wanted is None or (wanted not in world.policies and s.policy in broken):
            name = self.control.active if wanted is None else s.policy
            self._log.error("policy_error", error=f"the active policy {name!r} is invalid (above); "
                            "nothing was written")
            self._close(backends, own_backends)
            return EXIT_CONFIG
        if self.control.active not in world.policies:
            self._log.warning("kept_policy_missing", policy=self.control.active, fallback=s.policy)
            if s.policy not in world.policies:
                where = ", ".join(map(str, world.policy_dirs))
                self._log.error("policy_error", error=f"policy {s.policy!r} not found in {where}; "
                                f"known: {', '.join(sorted(world.policies))}")
                self._close(backends, own_backends)
                return EXIT_CONFIG
            self.control.active = s.policy
        worker = Worker(max(s.tick_s, 0.5))
        executor = Executor(Applier(journal, dry_run=s.dry_run), worker)
        self.tick = Tick(world, executor=executor, control=self.control, hub=self.hub, engine=self.engine,
                         clock=self.clock, tick_s=s.tick_s, dry_run=s.dry_run,
                         before_sample=self.before_sample)
        self.scheduler = Scheduler(s.tick_s, self.clock, self.sleep)
        self.notifier = Notifier(self._environ)
        self.live = Live(self, self.live_options or LiveOptions.for_daemon(s, self.sleep is asyncio.sleep))
        self._log.info("start", policy=self.control.active, devices=len(world.devices),
                       knobs=len(world.knobs), tick_s=s.tick_s, dry_run=s.dry_run, state_dir=str(s.state_dir))
        watchdog = (asyncio.create_task(self._watchdog()) if self.notifier.watchdog_interval_s else None)
        code = 1
        try:
            if not self._stop.is_set():  # a stop during start-up: no service, no tick, straight to restore
                await services.start(self, backends)
                await self.live.start()
            await self.scheduler.run(self._run_tick, self._stop, max_ticks, until)
            code = 0
        finally:
            # Hardware first: every step below is guarded so that nothing (not even a closed stderr)
            # can keep the journaled knobs from being restored.
            if watchdog is not None:
                watchdog.cancel()
            try:  # nothing writes between ticks any more
                await asyncio.wait_for(self.live.stop(), self.stop_timeout_s)
            except Exception as exc:  # noqa: BLE001 - the restore below must run whatever happened
                _guard(self._log.error, "live_stop_failed", error=f"{type(exc).__name__}: {exc}")
            if s.dry_run:
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
                    _guard(self._log.info, "stop", restored=len(report.restored), failed=dict(report.failed))
            _guard(self.notifier.stopping)
            try:
                await services.stop(self)
            except Exception:  # noqa: BLE001
                pass
            worker.shutdown()
            if self.tick is not None:
                self.tick.sampler.close()  # the read guard's thread (one stuck in a hung read ends with it)
            self._close(backends, own_backends)
            self.notifier.close()
        return code

    def _restore_dirty(self, journal: Journal, backends: Sequence[Backend]) -> None:
        if not journal.dirty:
            return
        if self.settings.dry_run:
            self._log.warning("journal_dirty", knobs=list(journal.entries()),
                              message="left for a real run or 'aithermd restore' (dry-run writes nothing)")
            return
        self._log.warning("journal_dirty", knobs=list(journal.entries()), message="restoring after a crash")
        report = restore_journal(journal, backends=backends)
        if not report.ok:
            self._log.error("restore_incomplete", failed=dict(report.failed))

    def _close(self, backends: Sequence[Backend], own: bool) -> None:
        if not own:
            return
        for backend in backends:
            try:
                backend.close()
            except Exception as exc:  # noqa: BLE001
                _guard(self._log.warning, "close_failed", backend=getattr(backend, "kind", "?"),
                       error=str(exc))

    async def _run_tick(self, seq: int, deadline: float) -> None:
        assert self.tick is not None and self.control is not None and self.notifier is not None
        if self._reload_requested:
            self._reload_requested = False
            try:
                await asyncio.to_thread(self.reload_now)
            except PolicyErrors:
                pass  # logged with FILE:LINE; the old policies stay
        if self._pending is not None:
            loaded, self._pending = self._pending, None
            self.tick.world = with_policies(self.tick.world, loaded)
            self.control.policies_changed(set(loaded.policies), self.settings.policy)
        started = time.perf_counter()  # the tick's real duration, also under a simulated clock
        snapshot = await self.live.tick(seq)  # under the tick lock, after hotplug/resume changes
        self._last_tick_done = self.clock.monotonic()
        duration_s = time.perf_counter() - started
        for _, handle in self._services:
            observe = getattr(handle, "observe_tick", None)
            if observe is not None:
                observe(duration_s)
        status = (f"policy {snapshot.policy.active}, {len(self.tick.applier.owned)} knobs controlled, "
                  f"{len(snapshot.degraded)} degraded" + (" (dry-run)" if snapshot.dry_run else ""))
        if seq == 1:
            self.notifier.ready(status)
        else:
            self.notifier.status(status)
        self._warn_unmatched()

    def selection_warnings(self, policy: Any) -> list[str]:
        """Each reference of ``policy`` (a loaded Policy) that selects nothing on this machine: a fan, GPU,
        RAPL zone or sensor that does not exist here (what ``aithermd check --sysfs-root`` reports), as
        ``FILE:LINE:COL: error: KEY: ...`` lines; [] for a policy without a document (a test engine's)."""
        if self.tick is None or getattr(policy, "document", None) is None:
            return []
        from aithermd.policy.devicecheck import check_devices, unsourced_fans
        devices = self.tick.world.devices
        return [err.format() for err in check_devices(policy, devices)] + [
            unsourced_message(policy.name, rule, curve, fans)
            for rule, curve, fans in unsourced_fans(policy, devices)]

    def _warn_unmatched(self) -> None:
        """Warn once per policy and machine when a policy in force (active or held) selects nothing here:
        at start, after a reload, a policy change or a hold, and after hotplug."""
        assert self.tick is not None and self.control is not None
        world = self.tick.world
        for name in dict.fromkeys([self.control.active, *(h.policy for h in self.control.holds)]):
            policy = world.policies.get(name)
            if policy is None or self._checked.get(name) == (id(policy), id(world.devices)):
                continue
            self._checked[name] = (id(policy), id(world.devices))
            unsourced = []
            if getattr(policy, "document", None) is not None:
                from aithermd.policy.devicecheck import unsourced_fans
                unsourced = unsourced_fans(policy, world.devices)
            for rule, curve, fans in unsourced:  # its fans can only run at 100 %: say so loudly
                self._log.warning("no_temperature_source", policy=name, rule=rule, curve=curve,
                                  fans=list(fans), message=unsourced_message(name, rule, curve, fans))
            for line in self.selection_warnings(policy):
                if "selects no temperature sensor" in line or (unsourced and "matches this source" in line):
                    continue
                self._log.warning("policy_selects_nothing", policy=name, error=line,
                                  message="this rule does nothing on this machine")

    async def _watchdog(self) -> None:
        """WATCHDOG=1 every half WATCHDOG_USEC while ticks keep completing."""
        assert self.notifier is not None and self.notifier.watchdog_interval_s is not None
        interval = self.notifier.watchdog_interval_s
        while True:
            await asyncio.sleep(interval)
            done = self._last_tick_done
            if done is not None and self.clock.monotonic() - done <= self.settings.tick_s + 2 * interval:
                self.notifier.watchdog()


def unsourced_message(policy: str, rule: str, curve: str, fans: Sequence[str]) -> str:
    """The warning for a fan rule whose curve finds no temperature sensor on the machine."""
    return (f"policy {policy}, rule {rule}: curve {curve} selects no temperature sensor on this machine, so "
            f"its {len(fans)} fan(s) run at 100 %; name a sensor `aithermd sensors` shows, or list "
            "alternatives with first: [...]")
