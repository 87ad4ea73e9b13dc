"""Energy windows: joules per device, and per job, unit or process, between a start and a stop.

A window sums the device increments of :class:`~aithermd.accounting.meter.EnergyMeter` (every GPU and RAPL
zone, J) from its start to its stop. A window with a **scope** also sums the energy *attributed* to that
scope (:mod:`aithermd.accounting.attribution`) -- the joules that job used, not the whole GPU's:

- ``job:N`` — processes in Slurm job N's cgroup; ``unit:NAME`` — in that systemd unit;
  ``container:ID`` — in the container whose id starts with ID; ``cgroup:/PATH`` — in that cgroup or below;
  ``pid:N`` — process N and its descendants.

Ids are random 63-bit numbers (never 0): unique across daemon restarts without any counter to keep, so a
Slurm epilog can never stop another job's window with an id that came round again. Windows survive a
restart: :meth:`EnergyWindows.to_json` / :meth:`from_json` keep them in the state directory with their sums
(and the meter keeps the counter points those sums end at). A window's duration and timeout run on the boot
clock (monotonic, counting sleep: an NTP step of the wall clock neither stretches nor cuts them); its
``started`` is the wall time it was opened, and the wall clock carries its start and deadline across a
restart only (saved as the wall times they fall at when saved, re-anchored at load).

A window that reaches its timeout stops summing there; its sums are kept for :data:`KEEP_ENDED_S` (the most
recent :data:`MAX_ENDED`), so its stop still returns them, marked ``"timed_out": true`` with the duration up
to the timeout (``aithermctl energy --timeout 1s -- CMD`` reports what was measured, and CMD's exit status).

A window belongs to the uid that opened it (only that uid or root may stop it); stopping can check the name
it was opened with; a caller lists its own open windows (root: all); each uid may hold at most ``per_uid``
open windows (root: ``max_windows`` in all). No D-Bus here: :mod:`aithermd.publish.dbus_service` maps the
errors below.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aithermd.accounting.meter import Increment
from aithermd.clock import Clock, RealClock
from aithermd.errors import AithermError, InvalidArgument

DEFAULT_TIMEOUT_S = 86_400.0  # timeout_s 0 means one day
MAX_TIMEOUT_S = 7 * 86_400.0
MAX_NAME = 256
KEEP_ENDED_S = 86_400.0  # how long a timed-out window's sums wait for its stop
MAX_ENDED = 256
SCOPE_KINDS = ("job", "unit", "container", "cgroup", "pid")
_SCOPE_VALUE = {
    "job": re.compile(r"^[0-9]{1,12}$"),
    "pid": re.compile(r"^[0-9]{1,10}$"),
    "unit": re.compile(r"^[A-Za-z0-9:_.@\\-]{1,255}$"),
    "container": re.compile(r"^[0-9a-f]{4,64}$"),
    "cgroup": re.compile(r"^/[A-Za-z0-9:_.@/\\=+-]{0,1023}$"),
}


class UnknownWindow(AithermError):
    """No open window with that id (stopped, timed out or never opened)."""


class WindowLimit(AithermError):
    """The uid already holds its maximum number of open windows."""


class NotOwner(AithermError):
    """The window belongs to another uid."""


class WrongWindow(InvalidArgument):
    """The window has another name than the one the caller expected (a stale id)."""


def parse_scope(scope: str) -> tuple[str, str] | None:
    """``"job:42"`` → ``("job", "42")``; ``""`` → None. Raises InvalidArgument for anything else."""
    if not scope:
        return None
    kind, sep, value = scope.partition(":")
    if not sep or kind not in SCOPE_KINDS or not _SCOPE_VALUE[kind].match(value):
        raise InvalidArgument(f"bad scope {scope[:80]!r}: expected job:N, unit:NAME, container:HEXID, "
                              f"cgroup:/PATH or pid:N")
    return kind, value


@dataclass
class Window:
    id: int
    name: str
    uid: int
    started: float  # wall s when opened (as shown)
    deadline: float  # wall s of the timeout when opened or restored (as shown)
    scope: str = ""
    joules: dict[str, float] = field(default_factory=dict)  # device id → J
    attributed: dict[str, float] = field(default_factory=dict)  # device id → J of the scope
    unmeasured_s: float = 0.0
    restarts: int = 0  # daemon restarts the window lived through
    t0: float = 0.0  # boot-clock s it started at (re-anchored after a restart)
    due: float = math.inf  # boot-clock s of its timeout
    since_pass: dict[str, float] = field(default_factory=dict)  # device id → J in it since the last pass

    def document(self, now: float, apart: frozenset[str] = frozenset(),
                 platform: frozenset[str] = frozenset(), estimated: frozenset[str] = frozenset()
                 ) -> dict[str, Any]:
        """The window so far at boot-clock ``now`` (s); ``total_j`` leaves out the ``apart`` devices (RAPL
        subzones, psys, an MMIO copy of a package), ``platform_j`` is psys, ``estimated`` the devices
        integrated from power."""
        joules = {k: round(v, 6) for k, v in sorted(self.joules.items())}
        total = sum(v for k, v in joules.items() if k not in apart)
        doc: dict[str, Any] = {"id": self.id, "name": self.name, "uid": self.uid,
                               "started": self.started, "duration_s": round(max(0.0, now - self.t0), 6),
                               "joules": joules, "total_j": round(total, 6),
                               "restarts": self.restarts, "unmeasured_s": round(self.unmeasured_s, 3)}
        if any(k in platform for k in joules):
            doc["platform_j"] = round(sum(v for k, v in joules.items() if k in platform), 6)
        if any(k in estimated for k in joules):
            doc["estimated"] = sorted(k for k in joules if k in estimated)
        if self.scope:
            attributed = {k: round(v, 6) for k, v in sorted(self.attributed.items())}
            doc.update(scope=self.scope, attributed=attributed,
                       attributed_total_j=round(sum(attributed.values()), 6))
        return doc


def _random_id() -> int:
    return secrets.randbits(63) or 1


class EnergyWindows:
    """Open windows, fed by :meth:`add` (device increments) and :meth:`add_scoped` (attributed energy)."""

    def __init__(self, clock: Clock | None = None, *, per_uid: int = 8, max_windows: int = 256,
                 new_id: Callable[[], int] = _random_id) -> None:
        self._clock = clock or RealClock()
        self.per_uid = per_uid
        self.max_windows = max_windows
        self._new_id = new_id
        self._windows: dict[int, Window] = {}
        self._ended: dict[int, tuple[Window, dict[str, Any]]] = {}  # timed out: the window, its document
        self._soonest = math.inf  # the earliest deadline of an open window
        self.changed = False  # set by every change; the owner clears it after saving
        # devices no total counts, the platform, estimated ones (from the meter's increments)
        self._roles: tuple[frozenset[str], frozenset[str], frozenset[str]] = (frozenset(),) * 3

    def start(self, name: str, timeout_s: float, uid: int, scope: str = "") -> int:
        """Open a window; returns its id (uint64, never 0). ``timeout_s``: 0 = one day, at most seven days;
        ``scope``: see the module docstring ("" = devices only).

        Raises InvalidArgument (bad timeout, name or scope), WindowLimit (too many open windows)."""
        if not isinstance(timeout_s, float | int) or not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidArgument(f"timeout_s must be a number ≥ 0, got {timeout_s!r}")
        if timeout_s > MAX_TIMEOUT_S:
            raise InvalidArgument(f"timeout_s {timeout_s:g} s exceeds {MAX_TIMEOUT_S:g} s")
        if len(name) > MAX_NAME:
            raise InvalidArgument(f"window name longer than {MAX_NAME} characters")
        parse_scope(scope)
        self.expire()
        mine = sum(1 for w in self._windows.values() if w.uid == uid)
        limit = self.max_windows if uid == 0 else self.per_uid
        if mine >= limit or len(self._windows) >= self.max_windows:
            raise WindowLimit(f"uid {uid} has {mine} open energy windows (limit {limit}, "
                              f"{self.max_windows} in all); stop one or wait for its timeout")
        wid = self._new_id()
        while wid in self._windows or wid <= 0:
            wid = _random_id()
        now, run, timeout_s = self._clock.wall(), self._clock.boottime(), timeout_s or DEFAULT_TIMEOUT_S
        self._windows[wid] = Window(wid, name, uid, now, now + timeout_s, scope, t0=run, due=run + timeout_s)
        self._soonest = min(self._soonest, run + timeout_s)
        self.changed = True
        return wid

    def stop(self, window_id: int, uid: int, *, root: bool = False,
             name: str | None = None) -> dict[str, Any]:
        """Close a window: ``{"id", "name", "uid", "started", "duration_s", "joules": {device id: J},
        "total_j", "restarts", "unmeasured_s"}`` (``total_j`` counts each device once: no RAPL subzone, psys
        or MMIO copy of a package; ``platform_j`` and ``estimated`` where they apply) and, for a scoped
        window, ``"scope"``, ``"attributed"`` ({device id: J}) and ``"attributed_total_j"``; a window that
        timed out gives its sums up to its timeout with ``"timed_out": true``. ``name``: when
        given (not None or ""), the window must have been opened with that name.

        Raises UnknownWindow, NotOwner (another uid's window, unless ``root``), WrongWindow."""
        self.expire()
        window = self._windows.get(window_id)
        ended = self._ended.get(window_id) if window is None else None
        if window is None and ended is None:
            raise UnknownWindow(f"no open energy window {window_id}")
        owner = window or ended[0]  # type: ignore[index]
        if owner.uid != uid and not root:
            raise NotOwner(f"energy window {window_id} belongs to uid {owner.uid}")
        if name and owner.name != name:
            raise WrongWindow(f"energy window {window_id} is {owner.name!r}, not {name!r}; left open")
        self.changed = True
        if ended is not None:  # it timed out: its sums up to then
            del self._ended[window_id]
            return ended[1]
        del self._windows[window_id]
        return owner.document(self._clock.boottime(), *self._roles)

    def scoped(self, window_id: int, uid: int, *, root: bool = False) -> bool:
        """Whether ``window_id`` is an open scoped window ``uid`` may stop (its last seconds need an
        accounting pass before :meth:`stop`)."""
        window = self._windows.get(window_id)
        return window is not None and bool(window.scope) and (root or window.uid == uid)

    def list(self, uid: int, *, root: bool = False) -> list[dict[str, Any]]:
        """The caller's open windows (every window for root), oldest first, as :meth:`stop` documents them
        so far."""
        self.expire()
        now = self._clock.boottime()
        return [w.document(now, *self._roles) for w in sorted(self._windows.values(), key=lambda w: w.started)
                if root or w.uid == uid]

    def expire(self) -> None:
        """End windows whose timeout has passed (their sums kept for a stop, see the module doc)."""
        now = self._clock.boottime()
        for wid in [w.id for w in self._windows.values() if w.due <= now]:
            window = self._windows.pop(wid)
            self._ended[wid] = (window, {**window.document(window.due, *self._roles), "timed_out": True})
            self.changed = True
        for wid in [wid for wid, (w, _) in self._ended.items() if w.due + KEEP_ENDED_S <= now]:
            del self._ended[wid]
        while len(self._ended) > MAX_ENDED:
            del self._ended[next(iter(self._ended))]
        self._soonest = min((w.due for w in self._windows.values()), default=math.inf)

    def open_count(self, uid: int | None = None) -> int:
        return sum(1 for w in self._windows.values() if uid is None or w.uid == uid)

    def scopes(self) -> set[str]:
        """The scopes open windows sum (for the accountant to total)."""
        return {w.scope for w in self._windows.values() if w.scope}

    def add(self, increment: Increment) -> None:
        """Device joules since the previous snapshot, to every open window."""
        if increment.apart or increment.platform or increment.estimated:
            self._roles = (self._roles[0] | increment.apart, self._roles[1] | increment.platform,
                           self._roles[2] | increment.estimated)
        if not self._windows:
            return
        for window in self._windows.values():
            since_pass = window.since_pass if window.scope else None
            for device_id, joules in increment.joules.items():
                window.joules[device_id] = window.joules.get(device_id, 0.0) + joules
                if since_pass is not None:
                    since_pass[device_id] = since_pass.get(device_id, 0.0) + joules
            if increment.unmeasured_s:
                window.unmeasured_s += max(increment.unmeasured_s.values())
        if self._soonest <= self._clock.boottime():
            self.expire()

    def add_scoped(self, per_scope: Mapping[str, Mapping[str, float]],
                   device_of: Callable[[str], str | None] = lambda d: d) -> None:
        """{scope: {device id: J}} attributed in one accounting interval, to the windows of each scope: to
        each at most the device's joules inside it since the last interval (a window opened within the
        interval has only its own seconds of it: a process charged the whole interval's idle floor, seconds
        before the window opened included, made a 4 s job's ``attributed`` 1,275 J of its 1,200 device J,
        attack9 T6). ``device_of``: the accounting's device of a meter device id (None: none; the RAPL
        package zones are one ``cpu``: :func:`aithermd.accounting.accountant.accounted_device`)."""
        for window in self._windows.values():
            inside: dict[str, float] = {}
            for device_id, joules in window.since_pass.items():
                if (name := device_of(device_id)) is not None:
                    inside[name] = inside.get(name, 0.0) + joules
            window.since_pass = {}
            for device_id, joules in per_scope.get(window.scope, {}).items():
                joules = min(joules, max(0.0, inside.get(device_id, 0.0)))
                window.attributed[device_id] = window.attributed.get(device_id, 0.0) + joules

    # ---- persistence -----------------------------------------------------------------------------------
    def to_json(self) -> list[dict[str, Any]]:
        """The open windows; ``begun`` and ``deadline``: their start and timeout as wall times by the wall
        clock now (what a restart re-anchors on), ``started``: the wall time each was opened."""
        wall = self._clock.wall() - self._clock.boottime()  # boot-clock s → wall s, now
        return [{"id": w.id, "name": w.name, "uid": w.uid, "started": w.started, "begun": w.t0 + wall,
                 "deadline": w.due + wall, "scope": w.scope, "joules": w.joules, "attributed": w.attributed,
                 "unmeasured_s": w.unmeasured_s, "restarts": w.restarts} for w in self._windows.values()]

    def restore(self, items: Iterable[Any], *, restarted: bool = True) -> int:
        """Windows saved by :meth:`to_json` (a previous daemon's); malformed entries are dropped, expired
        ones too. Returns how many were restored."""
        n, run = 0, self._clock.boottime() - self._clock.wall()  # wall s → boot-clock s, now
        for d in items if isinstance(items, list) else []:
            try:
                w = Window(int(d["id"]), str(d["name"])[:MAX_NAME], int(d["uid"]), float(d["started"]),
                           float(d["deadline"]), str(d.get("scope") or ""),
                           {str(k): float(v) for k, v in dict(d.get("joules") or {}).items()},
                           {str(k): float(v) for k, v in dict(d.get("attributed") or {}).items()},
                           float(d.get("unmeasured_s") or 0.0), int(d.get("restarts") or 0) + int(restarted))
                parse_scope(w.scope)
                w.t0, w.due = float(d.get("begun", w.started)) + run, w.deadline + run
            except (KeyError, TypeError, ValueError, AithermError):
                continue
            if w.id > 0 and w.id not in self._windows:
                self._windows[w.id] = w
                n += 1
        self.expire()
        return n
