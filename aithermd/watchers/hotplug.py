"""Hotplug: the udev events that say devices appeared or vanished, collected until they settle.

A pyudev ``Monitor`` (libudev's netlink monitor, the events udev rebroadcasts after processing) runs in a
thread of its own filtered to the ``hwmon``, ``drm``, ``pci`` and ``powercap`` subsystems; each event
crosses to the event loop with ``call_soon_threadsafe`` and is kept by :class:`Hotplug` until it settles
(``settle_s`` without a newer event for the same family, so a driver that registers five hwmon devices is
rediscovered once). A ``remove`` whose sysfs directory still exists waits until it is gone (at most
``remove_wait_s``). At each tick's start the runtime asks :meth:`Hotplug.poll` which backend families are
due, and the tick rediscovers exactly those (:mod:`aithermd.runtime.changes`, through
:func:`aithermd.backends.registry.rediscover`, which keeps every id):

- ``hwmon`` events → the hwmon backends (inline and slow); ``powercap`` → RAPL; ``pci``/``drm`` events of an
  NVIDIA device (PCI vendor 0x10de, or a vendor the event does not name) → NVML. Other PCI/DRM devices are
  left to the hwmon events their drivers send.

The monitor's own failure (its thread ended: ENOBUFS on the netlink socket, libudev gone) is detected by
:meth:`Hotplug.check` — called every second by the supervisor task and at each tick — and the monitor
restarted after a backoff (1 s doubling to 60 s), followed by a rescan of every family, since events were
missed meanwhile.
Restarts and rescans are counted (``aithermd_udev_monitor_restarts_total``, ``aithermd_udev_rescans_total``),
and every :data:`RESCAN_S` a rescan of every family runs anyway: a monitor that stays alive but loses
events (a netlink buffer overrun) is caught too. A ``remove``/``unbind`` of an NVIDIA PCI device releases
that GPU first (its originals restored: :mod:`aithermd.runtime.release`); an ``add``/``bind`` lets it be
adopted again.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.backends.registry import ALL
from aithermd.clock import Clock, RealClock

SUBSYSTEMS = ("hwmon", "drm", "pci", "powercap")
RESCAN_S = 300.0  # a periodic rescan of every family: what a dead or overrun monitor missed is found
ACTIONS = frozenset({"add", "remove", "bind", "unbind", "move"})
GPU_ACTIONS = frozenset({"add", "remove", "bind", "unbind"})  # a GPU to release first, or to adopt again
NVIDIA_VENDOR = "10de"


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One udev event: ``action`` (add, remove, bind, unbind, move), ``subsystem``, ``sys_path`` (absolute
    sysfs path), ``vendor`` (PCI vendor id, lower-case hex, when the event names one)."""

    action: str
    subsystem: str
    sys_path: str
    vendor: str | None = None

    @property
    def family(self) -> str | None:
        """The backend family to rediscover (``hwmon``, ``powercap``, ``nvml``), or None."""
        if self.subsystem == "hwmon":
            return "hwmon"
        if self.subsystem == "powercap":
            return "powercap"
        if self.subsystem in ("pci", "drm") and self.vendor in (None, NVIDIA_VENDOR):
            return "nvml"
        return None


def event_from_udev(device: Any) -> DeviceEvent:
    """A :class:`DeviceEvent` from a ``pyudev.Device`` received by a monitor (its uevent properties)."""
    props = device.properties
    pci_id = props.get("PCI_ID")
    if pci_id is None and device.subsystem == "drm":
        try:
            parent = device.find_parent("pci")
            pci_id = parent.properties.get("PCI_ID") if parent is not None else None
        except Exception:  # noqa: BLE001 - the parent may be gone already (remove)
            pci_id = None
    vendor = pci_id.split(":", 1)[0].lower() if pci_id else None
    return DeviceEvent(str(device.action), str(device.subsystem), str(device.sys_path), vendor)


class UdevMonitor:
    """A pyudev netlink monitor in a daemon thread; ``on_event(DeviceEvent)`` is called on ``loop``.
    ``alive`` is false once the thread ended; ``error`` says why."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[DeviceEvent], None],
                 subsystems: Sequence[str] = SUBSYSTEMS, poll_s: float = 0.5) -> None:
        self.loop, self.on_event, self.subsystems, self.poll_s = loop, on_event, tuple(subsystems), poll_s
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aithermd-udev", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context())
            for subsystem in self.subsystems:
                monitor.filter_by(subsystem)
            monitor.start()
            self.ready.set()
            while not self._stop.is_set():
                device = monitor.poll(timeout=self.poll_s)
                if device is not None and device.action in ACTIONS:
                    self.loop.call_soon_threadsafe(self.on_event, event_from_udev(device))
        except BaseException as exc:  # noqa: BLE001 - reported through .error; the supervisor restarts us
            self.error = exc
        finally:
            self.ready.set()


class Hotplug:
    """Collects device events and says which backend families are due for rediscovery.

    ``monitor_factory(loop, on_event)`` builds the monitor (default :class:`UdevMonitor`; None: events come
    only from :meth:`submit`); ``exists(path)`` tells whether a removed device's sysfs directory is still
    there. The tick asks :meth:`poll` at its start."""

    name = "hotplug"

    def __init__(self, *, monitor_factory: Callable[..., Any] | None = UdevMonitor, settle_s: float = 0.2,
                 remove_wait_s: float = 5.0, clock: Clock | None = None,
                 exists: Callable[[str], bool] = os.path.exists, backoff_s: tuple[float, float] = (1.0, 60.0),
                 rescan_s: float = RESCAN_S) -> None:
        self.monitor_factory, self.settle_s, self.remove_wait_s = monitor_factory, settle_s, remove_wait_s
        self.clock = clock or RealClock()
        self.exists = exists
        self.backoff_s = backoff_s
        self.monitor: Any = None
        self.restarts = 0
        self.rescans = 0
        self.rescan_s = rescan_s
        self._next_rescan: float | None = None
        self.events_seen = 0
        self._gpu_events: list[DeviceEvent] = []
        self._pending: dict[str, list[tuple[float, DeviceEvent]]] = {}
        self._retry_at: float | None = None
        self._delay = backoff_s[0]
        self._started_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._log = structlog.get_logger("aithermd.hotplug")

    # -- events ----------------------------------------------------------------------------------------
    def submit(self, event: DeviceEvent) -> None:
        """Keep ``event`` for the next :meth:`due` (on the loop)."""
        family = event.family
        self.events_seen += 1
        self._log.info("uevent", action=event.action, subsystem=event.subsystem, path=event.sys_path,
                       family=family)
        if family is not None:
            self._pending.setdefault(family, []).append((self.clock.monotonic(), event))
        if family == "nvml" and event.subsystem == "pci" and event.action in GPU_ACTIONS:
            self._gpu_events.append(event)

    def take_gpu_events(self) -> list[DeviceEvent]:
        """The NVIDIA PCI add/bind/remove/unbind events since the last call (a GPU to release, or to adopt
        again), oldest first."""
        events, self._gpu_events = self._gpu_events, []
        return events

    def rescan_all(self) -> None:
        self.rescans += 1
        self._pending.setdefault(ALL, []).append((self.clock.monotonic(), DeviceEvent("rescan", "", "")))

    def due(self) -> set[str]:
        """The families whose events have settled (``*`` for all); they are taken out."""
        now = self.clock.monotonic()
        out: set[str] = set()
        for family, events in list(self._pending.items()):
            newest = max(t for t, _ in events)
            if now - newest < self.settle_s:
                continue
            waiting = [e for t, e in events if e.action == "remove" and e.sys_path and self.exists(e.sys_path)
                       and now - t < self.remove_wait_s]
            if waiting:
                continue
            del self._pending[family]
            out.add(family)
        return out

    def poll(self) -> set[str]:
        """At the tick's start: restart a failed monitor when its backoff is over, then :meth:`due`."""
        self.check()
        return self.due()

    # -- the monitor and its supervisor ----------------------------------------------------------------
    async def start(self) -> None:
        if self.monitor_factory is None:
            return
        self._start_monitor()
        self._task = asyncio.create_task(self._supervise())

    def _start_monitor(self) -> None:
        self.monitor = self.monitor_factory(asyncio.get_running_loop(), self.submit)
        self.monitor.start()
        self._started_at = self.clock.monotonic()

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.check()

    def check(self) -> bool:
        """Restart the monitor when its thread ended (after the backoff); True when it was restarted. Every
        ``rescan_s`` a rescan of every family catches what a monitor that died quietly missed."""
        now = self.clock.monotonic()
        if self._next_rescan is None:
            self._next_rescan = now + self.rescan_s
        elif now >= self._next_rescan:
            self._next_rescan = now + self.rescan_s
            self.rescan_all()
        monitor = self.monitor
        if monitor is None or monitor.alive:
            if monitor is not None and now - self._started_at > self.backoff_s[1]:
                self._delay = self.backoff_s[0]
            return False
        if self._retry_at is None:
            self._log.error("fault", subject="hotplug", message=f"udev monitor failed: {monitor.error!r}; "
                            f"restarting in {self._delay:g} s")
            self._retry_at = now + self._delay
            self._delay = min(self._delay * 2, self.backoff_s[1])
        if now < self._retry_at:
            return False
        self._retry_at = None
        self.restarts += 1
        self._start_monitor()
        self.rescan_all()  # events were missed while it was down
        self._log.warning("udev_monitor_restarted", restarts=self.restarts)
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.monitor is not None:
            self.monitor.stop()
