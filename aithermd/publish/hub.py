"""StateHub: the one place a tick's frozen :class:`~aithermd.model.Snapshot` is published.

The control loop calls :meth:`StateHub.publish` once per tick; D-Bus, Prometheus, energy windows and the
history read from here and never touch hardware. Listeners run synchronously on the event loop thread
right after publish, so they must be cheap (store, schedule, rate-limit); an exception in one listener is
logged and never reaches the loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import structlog

from aithermd.model import Event, Snapshot
from aithermd.publish.columns import Columns

Listener = Callable[[Snapshot, Sequence[Event]], None]


class StateHub:
    """Holds the latest snapshot, the history of published values as columns and recent events.

    ``history_s``: how many seconds :attr:`columns` keeps (one float per series per tick, sized from it and
    the tick, at most ``max_snapshots`` rows, bounded in bytes: :mod:`aithermd.publish.columns`);
    ``events_max``: how many recent events :meth:`recent_events` keeps (its default ``limit``); an event is
    also dropped once it is older than ``history_s`` (by the monotonic time of the snapshot it was published
    with), so the events held are at most ``events_max`` and none older than the history: the memory they
    take (~0.9 kB an event, ≤ ~90 kB) stops growing once the history is full, however few events a quiet
    machine makes (issue 22: a count bound alone of 1000 events grew the daemon's RSS by ~0.9 MB over its
    first ~40 minutes on the reference tree). Only the latest snapshot is kept whole.
    """

    def __init__(self, history_s: float = 900.0, max_snapshots: int = 3600, events_max: int = 100) -> None:
        self.history_s = history_s
        self._latest: Snapshot | None = None
        self.columns = Columns(history_s, max_snapshots)
        self._events: deque[Event] = deque(maxlen=events_max)
        self._event_t: deque[float] = deque(maxlen=events_max)  # t_mono (s) of each event's publish
        self._listeners: list[Listener] = []
        # the services' own state, for the exporter: {"udev": {"restarts", "rescans"}, "dbus": {"connected",
        # "reconnects"}}; each service replaces its entry (never mutates a published one)
        self.status: dict[str, dict[str, Any]] = {}
        self._log = structlog.get_logger("aithermd.hub")

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    def publish(self, snapshot: Snapshot, events: Sequence[Event] = ()) -> None:
        self._latest = snapshot
        self.columns.append(snapshot)
        times = self._event_t
        if events:
            self._events.extend(events)
            times.extend(repeat(snapshot.t_mono, len(events)))
        if times and times[0] < snapshot.t_mono - self.history_s:
            self._forget(snapshot.t_mono - self.history_s)
        for listener in tuple(self._listeners):
            try:
                listener(snapshot, events)
            except Exception:  # a consumer's bug never stops the control loop
                self._log.exception("listener_failed", listener=repr(listener))

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(snapshot, events)`` after each publish; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def recent_events(self, limit: int = 100) -> list[Event]:
        """The last ``limit`` events published (oldest first), of those kept (see the class)."""
        return list(self._events)[-limit:]

    def _forget(self, before: float) -> None:
        """Drop the events published before monotonic time ``before`` (s)."""
        events, times = self._events, self._event_t
        while times and times[0] < before:
            times.popleft()
            events.popleft()
