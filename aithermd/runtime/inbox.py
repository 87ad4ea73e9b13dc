"""The tick's inbox: what happens between ticks is posted here and handled at the next tick's start.

A reload (SIGHUP, D-Bus ``Reload``), devices that appeared or vanished (hotplug), a resume after sleep and the
events of the watchers beside the tick (the fast lane, suspend) are messages. Nothing outside the tick
assigns what the tick works on: :meth:`Inbox.drain`, called by the tick under its lock, hands over what came
since the last tick, in order, and the tick applies it (:mod:`aithermd.runtime.changes`) before it samples.

:meth:`Inbox.post` may be called from any thread (a D-Bus reload loads the policies in a worker thread and
posts the result). :meth:`Inbox.request` posts and waits until a tick handled the message (logind keeps its
inhibitor lock until the resume re-apply is done). *Sources* (:meth:`Inbox.add_source`) are asked for
messages at each drain: hotplug events that settled, a suspend with no resume past its limit — conditions on
the clock that a tick looks at rather than a timer of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aithermd.model import Event
from aithermd.runtime.world import PolicySet


@dataclass(frozen=True)
class Reload:
    """Load the policies again (SIGHUP); loaded off the loop at the tick's start, all-or-nothing."""


@dataclass(frozen=True)
class Policies:
    """A policy set already loaded and checked (D-Bus ``Reload``): swap it in."""

    policy_set: PolicySet


@dataclass(frozen=True)
class Rediscover:
    """The backend ``families`` whose devices changed (``*``: all)."""

    families: frozenset[str]


@dataclass(frozen=True)
class Release:
    """Let go of a GPU (:mod:`aithermd.runtime.release`): ``device_id`` (``aithermctl gpu release``, D-Bus
    ``ReleaseGpu``), or the GPU on PCI ``bus_id`` that udev says is being removed or unbound. ``reply``
    receives the sentence for the caller, or the exception raised."""

    device_id: str | None = None
    bus_id: str | None = None
    reply: list[Any] = field(default_factory=list, compare=False)


@dataclass(frozen=True)
class Unrelease:
    """udev says the GPU on PCI ``bus_id`` is back (``add``/``bind``): it may be adopted again."""

    bus_id: str


@dataclass(frozen=True)
class Resume:
    """Writing again after a sleep: every owned knob re-applied to its last decision; ``why`` starts the
    ``sleep`` event ("resumed", "no resume announced")."""

    why: str


@dataclass(frozen=True)
class Events:
    """Events of the watchers, to ride on the next snapshot (before the tick's own)."""

    events: tuple[Event, ...]


Message = Reload | Policies | Rediscover | Release | Unrelease | Resume | Events


@dataclass
class _Posted:
    message: Message
    done: asyncio.Future[None] | None = field(default=None, compare=False)


class Inbox:
    """Messages for the next tick (see the module doc)."""

    def __init__(self) -> None:
        self._queue: deque[_Posted] = deque()
        self._lock = threading.Lock()
        self._sources: list[Callable[[], Iterable[Message]]] = []

    def post(self, message: Message) -> None:
        """Queue ``message`` for the next tick (any thread)."""
        with self._lock:
            self._queue.append(_Posted(message))

    def post_events(self, events: Sequence[Event]) -> None:
        """Queue ``events`` to ride on the next snapshot (any thread); nothing for none."""
        if events:
            self.post(Events(tuple(events)))

    async def request(self, message: Message) -> None:
        """Queue ``message`` and wait until a tick has handled it (on the loop)."""
        done = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queue.append(_Posted(message, done))
        await done

    def add_source(self, source: Callable[[], Iterable[Message]]) -> Callable[[], None]:
        """Ask ``source()`` for messages at every drain; returns a function that removes it."""
        self._sources.append(source)
        return lambda: self._sources.remove(source) if source in self._sources else None

    def drain(self) -> list[tuple[Message, Callable[[], None]]]:
        """What came since the last drain, oldest first, then what the sources say now; each with the
        function to call once it is handled."""
        out: list[tuple[Message, Callable[[], None]]] = []
        if self._queue:  # a post that lands meanwhile is taken at the next drain
            with self._lock:
                posted, self._queue = list(self._queue), deque()
            out = [(p.message, _resolver(p.done)) for p in posted]
        for source in tuple(self._sources):
            if said := source():  # mostly nothing: no list made for it
                out += [(m, _noop) for m in said]
        return out


def _noop() -> None:
    pass


def _resolver(done: asyncio.Future[Any] | None) -> Callable[[], None]:
    if done is None:
        return _noop
    return lambda: done.set_result(None) if not done.done() else None
