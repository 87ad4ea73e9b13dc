"""Energy windows: joules per GPU and RAPL zone between StartEnergyWindow and StopEnergyWindow.

A window sums, snapshot by snapshot, the increase of every energy channel of GPU and powercap devices in the
published snapshots (``gpu<N>/energy``: NVML total energy consumption; ``powercap:<zone>/energy``: RAPL
``energy_uj``; both already in J). Summing per tick keeps a window right across a device that vanishes
(its joules so far stay), across a failed read (the next good one covers the gap) and across a counter
that goes backwards (RAPL wraps at ``max_energy_range_uj``;
that interval is estimated from the zone's power channel times the tick interval). Resolution is one tick.

A window belongs to the uid that opened it (only that uid or root may stop it), outlives the caller's
connection, and ends when stopped or when its timeout passes; each uid may hold at most ``per_uid`` open
windows. No D-Bus here: :mod:`aithermd.publish.dbus_service` maps the errors below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aithermd.clock import Clock, RealClock
from aithermd.errors import AithermError, InvalidArgument
from aithermd.model import DeviceKind, Event, Quantity, Snapshot, Status

DEFAULT_TIMEOUT_S = 86_400.0  # timeout_s 0 means one day
MAX_TIMEOUT_S = 7 * 86_400.0


class UnknownWindow(AithermError):
    """No open window with that id (stopped, timed out or never opened)."""


class WindowLimit(AithermError):
    """The uid already holds its maximum number of open windows."""


class NotOwner(AithermError):
    """The window belongs to another uid."""


@dataclass
class _Window:
    id: int
    name: str
    uid: int
    started: float  # monotonic s
    deadline: float  # monotonic s
    joules: dict[str, float] = field(default_factory=dict)  # device id → J


def _energy_points(s: Snapshot, carried: dict[str, tuple[str, float, float | None]]
                   ) -> dict[str, tuple[str, float, float | None]]:
    """{channel id: (device id, J, power W or None)} for the energy channels of GPUs and RAPL zones: this
    snapshot's value when ok, else the last good point from ``carried`` (a failed read loses nothing)."""
    out: dict[str, tuple[str, float, float | None]] = {}
    for dev in s.devices:
        if dev.kind not in (DeviceKind.GPU, DeviceKind.POWERCAP):
            continue
        power = None
        for ch in dev.channels:
            r = s.readings.get(ch.id)
            if ch.quantity is Quantity.POWER and r is not None and r.status is Status.OK:
                power = r.value
        for ch in dev.channels:
            r = s.readings.get(ch.id)
            if ch.quantity is not Quantity.ENERGY:
                continue
            if r is not None and r.status is Status.OK and r.value is not None and math.isfinite(r.value):
                out[ch.id] = (dev.id, r.value, power)
            elif ch.id in carried:
                out[ch.id] = carried[ch.id]
    return out


class EnergyWindows:
    """Open windows, fed by ``on_publish`` (a :class:`~aithermd.publish.hub.StateHub` listener).

    ``per_uid``: open windows one unprivileged uid may hold; root (a Slurm prolog opening one per job) is
    bounded only by ``max_windows``, open windows in all.
    """

    def __init__(self, clock: Clock | None = None, *, per_uid: int = 8, max_windows: int = 256) -> None:
        self._clock = clock or RealClock()
        self.per_uid = per_uid
        self.max_windows = max_windows
        self._windows: dict[int, _Window] = {}
        self._next_id = 1
        self._last: Snapshot | None = None
        self._points: dict[str, tuple[str, float, float | None]] = {}

    def start(self, name: str, timeout_s: float, uid: int) -> int:
        """Open a window; returns its id (uint64, never 0). ``timeout_s``: 0 = one day, at most seven days.

        Raises InvalidArgument (bad timeout or name), WindowLimit (too many open windows)."""
        if not isinstance(timeout_s, float | int) or not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidArgument(f"timeout_s must be a number ≥ 0, got {timeout_s!r}")
        if timeout_s > MAX_TIMEOUT_S:
            raise InvalidArgument(f"timeout_s {timeout_s:g} s exceeds {MAX_TIMEOUT_S:g} s")
        if len(name) > 256:
            raise InvalidArgument("window name longer than 256 characters")
        self.expire()
        mine = sum(1 for w in self._windows.values() if w.uid == uid)
        limit = self.max_windows if uid == 0 else self.per_uid
        if mine >= limit or len(self._windows) >= self.max_windows:
            raise WindowLimit(f"uid {uid} has {mine} open energy windows (limit {limit}, "
                              f"{self.max_windows} in all); stop one or wait for its timeout")
        now = self._clock.monotonic()
        window = _Window(self._next_id, name, uid, now, now + (timeout_s or DEFAULT_TIMEOUT_S))
        self._next_id += 1
        for device_id, _j, _p in self._points.values():
            window.joules.setdefault(device_id, 0.0)
        self._windows[window.id] = window
        return window.id

    def stop(self, window_id: int, uid: int, *, root: bool = False) -> dict[str, Any]:
        """Close a window: ``{"id", "name", "duration_s", "joules": {device id: J}, "total_j"}``.

        Raises UnknownWindow, NotOwner (another uid's window, unless ``root``)."""
        self.expire()
        window = self._windows.get(window_id)
        if window is None:
            raise UnknownWindow(f"no open energy window {window_id}")
        if window.uid != uid and not root:
            raise NotOwner(f"energy window {window_id} belongs to uid {window.uid}")
        del self._windows[window_id]
        joules = {k: round(v, 6) for k, v in sorted(window.joules.items())}
        return {"id": window.id, "name": window.name,
                "duration_s": round(self._clock.monotonic() - window.started, 6),
                "joules": joules, "total_j": round(sum(joules.values()), 6)}

    def expire(self) -> None:
        """Drop windows whose timeout has passed."""
        now = self._clock.monotonic()
        for wid in [w.id for w in self._windows.values() if w.deadline <= now]:
            del self._windows[wid]

    def open_count(self, uid: int | None = None) -> int:
        return sum(1 for w in self._windows.values() if uid is None or w.uid == uid)

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event] = ()) -> None:
        points = _energy_points(snapshot, self._points)
        if self._windows and self._last is not None:
            dt = max(0.0, snapshot.t_mono - self._last.t_mono)
            increase: dict[str, float] = {}
            for cid, (device_id, joules, power) in points.items():
                before = self._points.get(cid)
                if before is None:
                    continue  # a new device: counts from its next snapshot
                delta = joules - before[1]
                if delta < 0:  # counter wrapped or reset: estimate this interval from power
                    delta = (power or 0.0) * dt
                increase[device_id] = increase.get(device_id, 0.0) + delta
            for window in self._windows.values():
                for device_id, delta in increase.items():
                    window.joules[device_id] = window.joules.get(device_id, 0.0) + delta
        self._last = snapshot
        self._points = points
        if self._windows:
            self.expire()
