"""Keeping the daemon on D-Bus for months: connect, and connect again whenever the bus drops us.

A dbus-daemon restart (a package upgrade, ``systemctl restart dbus``, a crash) closes every connection; a
daemon that connected once is then gone from the bus for good while its process looks healthy, and
``aithermctl`` reports "not running". :class:`DbusKeeper` owns the service's lifetime instead:

- at start it tries once (within ``first_timeout_s``) and returns either way: the control loop never waits
  for a bus;
- while not connected it tries again with backoff (:data:`BACKOFF_S`: 1 s doubling to 60 s): connect,
  export ``io.github.aithermd.Daemon1``, request the name (:func:`aithermd.publish.dbus_service.start`);
  each failure is logged with its reason (``dbus_unavailable``; ``dbus_name_refused`` when the bus refused
  the name: a bus policy without ``own`` for root, AccessDenied, or another owner) — the first time and
  whenever the reason changes, then once a minute at most;
- once connected it waits for the disconnect (``dbus_lost``), drops that connection's service and goes back
  to trying. The operator's state, energy windows and history live outside the connection and survive.

``StateHub.status["dbus"]`` says ``connected`` and counts ``reconnects`` (``aithermd_dbus_connected``,
``aithermd_dbus_reconnects_total``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

BACKOFF_S = (1.0, 60.0)
REPEAT_LOG_S = 60.0


class DbusKeeper:
    """Runs ``start()`` (a coroutine returning a :class:`~aithermd.publish.dbus_service.DbusHandle`, raising
    on failure) until it succeeds, and again after each disconnect. ``hub``: where ``status["dbus"]`` is
    published (None: nowhere)."""

    def __init__(self, start: Callable[[], Awaitable[Any]], *, hub: Any = None, bus: str = "",
                 backoff_s: tuple[float, float] = BACKOFF_S) -> None:
        self._start, self._hub, self.bus, self.backoff_s = start, hub, bus, backoff_s
        self.handle: Any = None
        self.connects = 0
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Event | None = None
        self._last_why: str | None = None
        self._last_logged = 0.0
        self._log = structlog.get_logger("aithermd.dbus")
        self._publish(False)

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)

    @property
    def connected(self) -> bool:
        bus = getattr(self.handle, "bus", None)
        return bus is not None and bus.connected

    @property
    def unique_name(self) -> str | None:
        return getattr(self.handle, "unique_name", None)

    def _publish(self, connected: bool) -> None:
        if self._hub is not None and hasattr(self._hub, "status"):
            self._hub.status["dbus"] = {"connected": connected, "reconnects": self.reconnects}

    async def start(self, first_timeout_s: float = 10.0) -> None:
        """Start keeping the connection; returns once the first attempt ended (or ``first_timeout_s``)."""
        self._first = asyncio.Event()
        self._task = asyncio.create_task(self._keep())
        try:
            await asyncio.wait_for(self._first.wait(), first_timeout_s)
        except TimeoutError:
            pass

    async def _keep(self) -> None:
        delay = self.backoff_s[0]
        while True:
            try:
                self.handle = await self._start()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - BusUnavailable and whatever the bus library raised
                self._failed(exc, delay)
                self._first_done()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            delay = self.backoff_s[0]
            self.connects += 1
            self._last_why = None
            if self.connects > 1:
                self._log.warning("dbus_reconnected", bus=self.bus, reconnects=self.reconnects,
                                  unique_name=self.unique_name)
            self._publish(True)
            self._first_done()
            bus = getattr(self.handle, "bus", None)
            if bus is None:  # "none": nothing to keep
                return
            try:
                await asyncio.shield(bus.wait_for_disconnect())
                why = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - how it ended is only reported
                why = f"{type(exc).__name__}: {exc}"
            self._publish(False)
            self._log.warning("dbus_lost", bus=self.bus, error=why, message="the bus dropped the daemon "
                              "(dbus-daemon restarted?): connecting again with backoff")
            handle, self.handle = self.handle, None
            try:
                await handle.stop()
            except Exception:  # noqa: BLE001 - its connection is gone either way
                pass

    def _failed(self, exc: BaseException, delay: float) -> None:
        why = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if why == self._last_why and now - self._last_logged < REPEAT_LOG_S:
            return
        self._last_why, self._last_logged = why, now
        refused = any(s in why for s in ("owned by another", "AccessDenied", "not allowed to own"))
        self._log.warning("dbus_name_refused" if refused else "dbus_unavailable", bus=self.bus, error=why,
                          retry_in_s=delay, message="the daemon runs on without D-Bus; trying again")

    def _first_done(self) -> None:
        if self._first is not None:
            self._first.set()

    async def stop(self) -> None:
        """Stop trying and release the name (if held)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        handle, self.handle = self.handle, None
        if handle is not None:
            await handle.stop()
        self._publish(False)
