"""Suspend and resume, as logind announces them.

systemd-logind emits ``org.freedesktop.login1.Manager.PrepareForSleep(b start)`` on the system bus:
``true`` just before the machine suspends or hibernates, ``false`` after it resumed (or the attempt
failed). A *delay* inhibitor lock (``Manager.Inhibit("sleep", who, why, "delay")``, a file descriptor that
holds the lock until closed) makes logind wait, up to ``InhibitDelayMaxSec``, until its holder has done what
it must before sleep (org.freedesktop.login1(5), "Inhibitor Locks"):

- ``PrepareForSleep(true)`` → ``on_sleep()`` (the loop stops writing), then the lock is released;
- ``PrepareForSleep(false)`` → ``on_resume()`` (every owned setting is re-applied and verified: drivers
  reset ``pwmN_enable`` and power limits on resume), then a new lock is taken.

The signal is matched on logind's bus name, so no other client can fake it. Signals are handled one at a
time, in order. A lost connection (logind or the bus restarted) is reconnected with a backoff (1 s doubling
to 60 s); a bus that cannot be reached at all is a warning, once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import structlog
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

LOGIN1 = "org.freedesktop.login1"
LOGIN1_PATH = "/org/freedesktop/login1"
MANAGER = "org.freedesktop.login1.Manager"
MATCH = (f"type='signal',sender='{LOGIN1}',path='{LOGIN1_PATH}',interface='{MANAGER}',"
         "member='PrepareForSleep'")
WHY = "re-apply fan and power settings after resume"


class LogindWatcher:
    """Watches logind on ``bus`` (``"system"`` or a D-Bus address). ``on_sleep``/``on_resume`` are
    awaited on the loop. ``inhibit``: hold a delay lock while awake."""

    name = "logind"

    def __init__(self, bus: str, on_sleep: Callable[[], Awaitable[object]],
                 on_resume: Callable[[], Awaitable[object]], *, inhibit: bool = True,
                 backoff_s: tuple[float, float] = (1.0, 60.0)) -> None:
        self.bus_name, self.on_sleep, self.on_resume = bus, on_sleep, on_resume
        self.inhibit, self.backoff_s = inhibit, backoff_s
        self.connected = asyncio.Event()
        self.sleeping = False
        self.signals = 0
        self._bus: MessageBus | None = None
        self._fd: int | None = None
        self._queue: asyncio.Queue[bool] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._warned = False
        self._log = structlog.get_logger("aithermd.logind")

    @property
    def inhibited(self) -> bool:
        """True while this watcher holds a delay inhibitor lock."""
        return self._fd is not None

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._supervise()), asyncio.create_task(self._consume())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._release()
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None
        self.connected.clear()

    # -- connection ------------------------------------------------------------------------------------
    def _new_bus(self) -> MessageBus:
        if self.bus_name == "system":
            return MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True)
        return MessageBus(bus_address=self.bus_name, negotiate_unix_fd=True)

    async def _supervise(self) -> None:
        delay = self.backoff_s[0]
        while True:
            try:
                bus = await self._new_bus().connect()
            except Exception as exc:  # noqa: BLE001 - no bus here: warn once, keep trying
                if not self._warned:
                    self._warned = True
                    self._log.warning("logind_unavailable", bus=self.bus_name,
                                      error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            self._bus = bus
            try:
                bus.add_message_handler(self._on_message)
                await self._call(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                 "AddMatch", "s", [MATCH])
                if self.inhibit and not self.sleeping:
                    await self._take()
                self.connected.set()
                delay = self.backoff_s[0]
                self._log.info("logind_watching", bus=self.bus_name, inhibited=self.inhibited)
                await bus.wait_for_disconnect()
            except Exception as exc:  # noqa: BLE001
                self._log.warning("logind_lost", bus=self.bus_name, error=f"{type(exc).__name__}: {exc}")
            self.connected.clear()
            self._release()
            bus.disconnect()
            self._bus = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_s[1])

    @staticmethod
    async def _call(bus: MessageBus, dest: str, path: str, iface: str, member: str, sig: str,
                    body: list[object]) -> Message:
        reply = await bus.call(Message(destination=dest, path=path, interface=iface, member=member,
                                       signature=sig, body=body))
        if reply is None or reply.message_type == MessageType.ERROR:
            raise RuntimeError(f"{iface}.{member}: {reply.error_name if reply else 'no reply'} "
                               f"{reply.body if reply else ''}")
        return reply

    # -- the inhibitor lock ----------------------------------------------------------------------------
    async def _take(self) -> None:
        if not self.inhibit or self._fd is not None or self._bus is None:
            return
        try:
            reply = await self._call(self._bus, LOGIN1, LOGIN1_PATH, MANAGER, "Inhibit", "ssss",
                                     ["sleep", "aithermd", WHY, "delay"])
        except Exception as exc:  # noqa: BLE001 - without a lock we still act, only without a delay
            self._log.warning("inhibit_failed", error=str(exc))
            return
        fd = reply.body[0]
        if reply.unix_fds:
            fd = reply.unix_fds[fd]
        self._fd = int(fd)

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- signals ---------------------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> bool:
        if (msg.message_type == MessageType.SIGNAL and msg.interface == MANAGER
                and msg.member == "PrepareForSleep" and msg.path == LOGIN1_PATH and msg.body):
            self.signals += 1
            self._queue.put_nowait(bool(msg.body[0]))
        return False

    async def _consume(self) -> None:
        while True:
            going = await self._queue.get()
            try:
                if going:
                    self.sleeping = True
                    self._log.info("prepare_for_sleep", start=True)
                    await self.on_sleep()
                    self._release()
                else:
                    self._log.info("prepare_for_sleep", start=False)
                    await self.on_resume()
                    self.sleeping = False
                    await self._take()
            except Exception:  # noqa: BLE001 - a failed handler never ends the watcher
                self._log.exception("sleep_handler_failed", start=going)
                if going:
                    self._release()
