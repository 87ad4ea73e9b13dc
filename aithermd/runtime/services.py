"""The services beside the tick, started and stopped alike.

One shape (:class:`Service`): a ``name``, ``async start()`` and ``async stop()``. A :class:`ServiceGroup`
starts them in order, each within ``start_timeout_s`` — one that cannot start (no bus, a port taken, its
module missing) is a warning and the daemon runs on without it — and stops those that started in reverse
order, each within ``stop_timeout_s`` (a failure or a timeout is a warning; stopping goes on). A service
that wants each tick's duration has ``after_tick(seconds)``.

The daemon's own (the watchers — fast lane, udev hotplug, logind — keep the same shape in
:mod:`aithermd.watchers`): :class:`Watchdog` (sd_notify ``WATCHDOG=1``), :class:`EnergyListener` (energy
accounting fed by each snapshot), :class:`DbusService` (``io.github.aithermd.Daemon1``, kept by
:class:`~aithermd.publish.dbus_keeper.DbusKeeper`, which connects again whenever the bus drops the daemon)
and :class:`MetricsService` (the Prometheus exporter).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog

from aithermd.clock import Clock
from aithermd.publish.hub import StateHub

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class Service(Protocol):
    """``start()`` raises when the service cannot run (:class:`Unavailable` names the warning);
    ``stop()`` releases what it holds (called only after a successful start)."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Unavailable(Exception):
    """A service cannot start: logged as the warning ``event`` with ``fields``."""

    def __init__(self, event: str, **fields: Any) -> None:
        super().__init__(event)
        self.event, self.fields = event, fields


def import_service(module: str) -> Any:
    """Import a service's module; raises :class:`Unavailable` (``service_unavailable``) when it is missing
    or broken."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a missing or broken service is a warning
        raise Unavailable("service_unavailable", module=module, error=f"{type(exc).__name__}: {exc}") from exc


class ServiceGroup:
    """Services started in order and stopped in reverse (see the module doc). ``started`` in start order."""

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.started: list[Service] = []
        self._log = structlog.get_logger("aithermd.services")

    async def start(self, services: Iterable[Service]) -> None:
        """Start each of ``services`` in turn; never raises for one that cannot start."""
        for service in services:
            if await self._try(service, service.start):
                self.started.append(service)

    async def start_late(self) -> None:
        """The second step of the started services that have one (``start_late()``, called once, after the
        first tick: see :class:`MetricsService`); one that fails is a warning, as at :meth:`start`, and is
        stopped and left out. Never raises."""
        for service in [s for s in self.started if hasattr(s, "start_late")]:
            if not await self._try(service, service.start_late):  # type: ignore[attr-defined]
                self.started.remove(service)
                await self._try(service, service.stop)

    async def _try(self, service: Service, step: Callable[[], Any]) -> bool:
        try:
            await asyncio.wait_for(step(), self.start_timeout_s)
        except Unavailable as exc:
            self._log.warning(exc.event, **exc.fields)
            return False
        except Exception as exc:  # noqa: BLE001 - the daemon runs on without it
            fields = getattr(service, "describe", dict)()
            self._log.warning(f"{service.name}_unavailable", **fields, error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    async def stop(self) -> None:
        """Stop the started services, the last started first; never raises."""
        while self.started:
            service = self.started.pop()
            try:
                await asyncio.wait_for(service.stop(), self.stop_timeout_s)
            except Exception as exc:  # noqa: BLE001 - stopping goes on
                self._log.warning("service_stop_failed", service=service.name,
                                  error=f"{type(exc).__name__}: {exc}")

    def get(self, name: str) -> Any:
        """The started service called ``name``, or None."""
        return next((s for s in self.started if s.name == name), None)

    def after_tick(self, seconds: float) -> None:
        """Tell the services that want it how long the last tick took (s)."""
        for service in self.started:
            after = getattr(service, "after_tick", None)
            if after is not None:
                after(seconds)


class Watchdog:
    """``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while ticks keep completing (``last_done()``: monotonic
    time of the last tick's end, None before the first), so systemd restarts a hung loop."""

    name = "watchdog"

    def __init__(self, notifier: Any, clock: Clock, tick_s: float,
                 last_done: Callable[[], float | None]) -> None:
        self.notifier, self.clock, self.tick_s, self.last_done = notifier, clock, tick_s, last_done
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.notifier.watchdog_interval_s:
            self._task = asyncio.create_task(self._run(self.notifier.watchdog_interval_s))

    async def _run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            done = self.last_done()
            if done is not None and self.clock.monotonic() - done <= self.tick_s + 2 * interval:
                self.notifier.watchdog()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class EnergyListener:
    """The energy service (:class:`~aithermd.accounting.service.EnergyService`) fed by every snapshot;
    saved on stop (windows, counter points and the history for the next start)."""

    name = "energy"

    def __init__(self, energy: Any, hub: StateHub) -> None:
        self.energy, self.hub = energy, hub

    async def start(self) -> None:
        self.energy.attach(self.hub)

    async def stop(self) -> None:
        self.energy.stop()  # detaches from the hub, then saves


class DbusService:
    """``io.github.aithermd.Daemon1`` on ``settings.bus`` (:mod:`aithermd.publish.dbus_service`), kept by a
    :class:`~aithermd.publish.dbus_keeper.DbusKeeper` (``handle``): a bus that cannot be had at start is the
    warning ``dbus_unavailable`` and is joined when it comes; a bus that drops the daemon (dbus-daemon
    restarted) is connected to again with backoff and the name requested again."""

    name = "dbus"

    def __init__(self, settings: Any, control: Any, hub: StateHub, clock: Clock, energy: Any) -> None:
        self.settings, self.control, self.hub, self.clock, self.energy = settings, control, hub, clock, energy
        self.handle: Any = None

    def describe(self) -> dict[str, Any]:
        return {"bus": self.settings.bus}

    @property
    def connected(self) -> bool:
        return self.handle is not None and self.handle.connected

    async def start(self) -> None:
        mod = import_service("aithermd.publish.dbus_service")
        from aithermd.publish.dbus_keeper import DbusKeeper

        s = self.settings

        async def connect() -> Any:  # each (re)connection: export the interface, own the name
            return await asyncio.wait_for(mod.start(s.bus, self.control, self.hub, dry_run=s.dry_run,
                                                    clock=self.clock, energy=self.energy), START_TIMEOUT_S)

        self.handle = DbusKeeper(connect, hub=self.hub, bus=s.bus)
        # the first attempt within half the group's start timeout; the keeper tries on in the background
        await self.handle.start(START_TIMEOUT_S / 2)

    async def stop(self) -> None:
        await self.handle.stop()


class MetricsService:
    """The Prometheus exporter on ``listen`` (:mod:`aithermd.publish.metrics`); a port that cannot be had is
    the warning ``metrics_unavailable``. It records each tick's duration.

    Started in two steps, so that the first tick does not wait for prometheus_client (issue 22: its import
    is ~30 ms of the daemon's CPU to ``READY=1``; the package imports its HTTP exposition, http.server, email
    and ssl whatever part of it is used): :meth:`start`, before the first tick, takes the port (a malformed
    address or a port taken is the warning, as before) and keeps what the exporter would have seen — each
    publish to the hub and each tick's duration; :meth:`start_late`, right after the first tick
    (``READY=1`` sent), builds the exporter, hands it those publishes and durations in order (its listeners
    get them as if they had been added first) and serves the port. So every counter counts from the first
    tick, and a scraper that connects before the exporter is built waits in the backlog for the same answer
    it had before."""

    name = "metrics"

    def __init__(self, listen: str, hub: StateHub, energy: Any) -> None:
        self.listen, self.hub, self.energy = listen, hub, energy
        self.handle: Any = None
        self._early: list[tuple[Any, Any]] = []  # (snapshot, events) published before the exporter
        self._ticks: list[float] = []  # each tick's duration (s) before the exporter
        self._unlisten: Callable[[], None] | None = None
        self._sock: Any = None  # the port, taken at start; the exporter's server owns it once built
        self._address: tuple[str, int] | None = None

    def describe(self) -> dict[str, Any]:
        return {"listen": self.listen}

    async def start(self) -> None:
        from aithermd.publish.listen import bind, parse_listen

        self._address = address = parse_listen(self.listen)
        self._sock = bind(*address) if address is not None else None
        self._unlisten = self.hub.add_listener(lambda snap, events: self._early.append((snap, events)))

    async def start_late(self) -> None:
        self._stop_keeping()
        early, ticks, self._early, self._ticks = self._early, self._ticks, [], []
        mod = import_service("aithermd.publish.metrics")
        hub = self.hub
        add = hub.add_listener

        def add_after_replay(listener: Any) -> Callable[[], None]:
            for snapshot, events in early:  # as StateHub.publish calls it: a failure is logged, never raised
                try:
                    listener(snapshot, events)
                except Exception:  # noqa: BLE001
                    structlog.get_logger("aithermd.hub").exception("listener_failed", listener=repr(listener))
            return add(listener)

        hub.add_listener = add_after_replay  # type: ignore[method-assign] - for this construction only
        try:
            self.handle = mod.start("none", hub, self.energy)  # built, counting, not serving yet
        finally:
            del hub.add_listener
        for seconds in ticks:
            self.handle.observe_tick(seconds)
        if self._address is not None:  # served only now: a scraper waiting in the backlog sees all of it
            self.handle.serve(*self._address, self._sock)
            self._sock = None  # the exporter's server owns it now

    def after_tick(self, seconds: float) -> None:
        if self.handle is None:
            self._ticks.append(seconds)
        else:
            self.handle.observe_tick(seconds)

    def _stop_keeping(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None

    async def stop(self) -> None:
        self._stop_keeping()
        if self._sock is not None:  # stopped before the exporter was built
            self._sock.close()
            self._sock = None
        if self.handle is not None:
            self.handle.stop()
