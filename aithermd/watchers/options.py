"""Which watchers run beside the tick, and how: :class:`WatcherOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aithermd.watchers.fastlane import FastLaneOptions


@dataclass(frozen=True)
class WatcherOptions:
    """``hotplug``: apply device events between ticks; ``udev``: take them from a udev monitor (False: only
    from :meth:`~aithermd.watchers.hotplug.Hotplug.submit`); ``logind_bus``: ``"system"`` or a D-Bus address
    where logind is watched (None: not watched); ``inhibit``: hold a delay inhibitor lock; ``fastlane``: its
    options (None: off); ``settle_s``: quiet time before hotplug events are applied (s); ``max_pause_s``:
    awake time after PrepareForSleep(true) after which writing resumes anyway (s); ``resume_timeout_s``:
    longest wait for the threaded knobs' re-apply on resume (s)."""

    hotplug: bool = False
    udev: bool = True
    logind_bus: str | None = None
    inhibit: bool = True
    fastlane: FastLaneOptions | None = None
    settle_s: float = 0.2
    max_pause_s: float = 120.0
    resume_timeout_s: float = 10.0

    @classmethod
    def for_daemon(cls, settings: Any, real_time: bool, *, machine_sysfs: str = "/sys") -> WatcherOptions:
        """On for a real machine in real time: hotplug when the sysfs root is the machine's own
        (``machine_sysfs``); logind on the daemon's bus address when it is one, else on the system bus when
        the daemon serves there or drives the machine's own sysfs (``--bus none``/``session`` choose where
        to serve, not whether the machine suspends); the fast lane when the tick is slower than 10 Hz.
        Off for fixture trees and simulated clocks."""
        if not real_time:
            return cls()
        on_sys = Path(settings.sysfs_root).resolve() == Path(machine_sysfs)
        bus = (settings.bus if "=" in settings.bus
               else "system" if settings.bus == "system" or on_sys else None)
        fast = FastLaneOptions(threaded=True) if settings.tick_s > 0.1 else None
        return cls(hotplug=on_sys, logind_bus=bus, fastlane=fast)
