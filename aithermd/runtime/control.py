"""The operator's state: the active policy, holds, overrides and explanations.

:class:`Control` implements :class:`aithermd.publish.control.DaemonControl`. Mutations are recorded here
and read by the loop at the start of the next tick. The active policy, the overrides and the detached holds
persist in ``<state_dir>/operator.json`` (written atomically), so they survive a restart; holds tied to a
D-Bus caller die with the daemon as they would with the caller. Expiries run on the boot clock, immune to
NTP steps; wall-clock times only show them and carry them across a restart (:mod:`aithermd.runtime.expiry`).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import structlog

from aithermd.actuate.journal import write_atomically
from aithermd.clock import Clock
from aithermd.errors import (
    InvalidArgument,
    LimitExceeded,
    OutOfRange,
    StateNotSaved,
    UnknownCookie,
    UnknownKnob,
    UnknownPolicy,
)
from aithermd.model import Event, Hold, Knob, KnobKind, PolicyStatus
from aithermd.publish.hub import StateHub
from aithermd.runtime.expiry import Expiries
from aithermd.runtime.operator_file import is_untrusted, move_aside, read_operator_state, usable_overrides
from aithermd.runtime.progress import Progress

STATE_FILE = "operator.json"
COOKIE_MAX = 2**32 - 1
# Holds in force at once, and per uid, for callers other than root. The shipped polkit policy lets any active
# seat user hold (hold-policy is allow_active=yes), so without a bound one user fills operator.json and every
# Holds read; a job launcher takes one hold per running job, and 8 covers nested `aithermctl run`s (the
# energy windows have the same per-uid bound, accounting/windows.py).
MAX_HOLDS_PER_UID = 8
MAX_HOLDS = 64


def policy_info(name: str, policy: Any) -> dict[str, Any]:
    """``{"name", "path", "description"}`` of a loaded policy (duck-typed on the loader's Policy)."""
    path = getattr(policy, "path", None)
    return {"name": name, "path": str(path) if path else "",
            "description": getattr(policy, "description", "") or ""}


class Control:
    """``policies()`` and ``knobs()`` give the current world's policies (name → Policy) and knobs
    (id → :class:`Knob`); ``reload()`` reloads policies all-or-nothing (raises PolicyErrors)."""

    def __init__(self, state_dir: Path, *, clock: Clock, hub: StateHub,
                 policies: Callable[[], Mapping[str, Any]], knobs: Callable[[], Mapping[str, Knob]],
                 reload: Callable[[], None], default_policy: str, pinned: bool = False,
                 warnings: Callable[[Any], list[str]] | None = None,
                 release: Callable[[str], Awaitable[str]] | None = None) -> None:
        self.path = Path(state_dir) / STATE_FILE
        self._warnings = warnings or (lambda _policy: [])
        self._clock, self._hub, self._reload, self._release = clock, hub, reload, release
        self._policies, self._knobs = policies, knobs
        self._log = structlog.get_logger("aithermd.control")
        self.active = default_policy
        self.holds: list[Hold] = []
        self.overrides: dict[str, tuple[float, float | None]] = {}  # knob → (value, expires wall or None)
        self._due = Expiries(clock)  # ("h", cookie) / ("o", knob id) → boot-clock expiry
        # cookies start anywhere in 1…2³²−1: a client still holding one of an earlier daemon's (after a
        # restart) must not release another caller's hold by it, as counting from 1 at every start allowed
        self._next_cookie = secrets.randbelow(COOKIE_MAX) + 1
        self._events: list[Event] = []
        self.progress = Progress()  # jobs' own progress rates (ReportProgress)
        self._load(default_policy, pinned)

    # -- persistence -----------------------------------------------------------------------------------
    def _load(self, default_policy: str, pinned: bool) -> None:
        try:
            doc = read_operator_state(self.path, self._knobs())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:  # an untrusted one is left as it is, unread: an error
            (self._log.error if is_untrusted(exc) else self._log.warning)(
                "operator_state_unreadable", path=str(self.path), error=str(exc))
            return
        if doc.dropped:  # kept aside for whoever wants it; the good part is saved again below
            aside = move_aside(self.path)
            self._log.error("operator_state_invalid", path=str(self.path), dropped=doc.dropped,
                            moved_to=str(aside) if aside else None,
                            message="started with the rest of it; the parts named were dropped")
        if doc.active and not pinned:
            self.active = doc.active
        for knob_id, (value, expires) in doc.overrides.items():
            self.overrides[knob_id] = (value, expires)
            if expires is not None:
                self._due.anchor(("o", knob_id), expires)
        per_uid: dict[int | None, int] = {}
        for hold in doc.holds:
            # the bounds of hold_policy hold for what a state file from before them brings back (uid 0: root)
            others = sum(n for u, n in per_uid.items() if u != 0)
            if hold.uid != 0 and (per_uid.get(hold.uid, 0) >= MAX_HOLDS_PER_UID or others >= MAX_HOLDS):
                self._log.warning("hold_dropped", cookie=hold.cookie, uid=hold.uid, policy=hold.policy,
                                  message="more holds than one user, or all, may have")
                continue
            per_uid[hold.uid] = per_uid.get(hold.uid, 0) + 1
            self.holds.append(hold)
            if hold.expires is not None:
                self._due.anchor(("h", hold.cookie), hold.expires)
        # the cookies go on from the random start (__init__), never from these: a cookie of the last run's
        # caller holds, gone with it, would otherwise be handed out again
        if doc.dropped:
            self._save()

    def _save(self, kept: tuple | None = None) -> None:
        """Write the state. On failure: with ``kept`` (:meth:`_state` before a change meant to survive a
        restart) the change is undone and StateNotSaved raised; without, the error is logged (a release
        or an expiry still takes effect now)."""
        wall = self._due.wall  # the expiries as the wall clock has them now
        doc = {"active_policy": self.active, "overrides": {
            k: {"value": v, "expires_wall": wall(("o", k), e)} for k, (v, e) in self.overrides.items()},
               "holds": [{**asdict(h), "expires": wall(("h", h.cookie), h.expires)}
                         for h in self.holds if h.detached]}
        try:
            write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
            self._due.mark()
        except OSError as exc:
            self._log.error("operator_state_not_saved", path=str(self.path), error=str(exc))
            if kept is not None:
                self.active, self.overrides, self.holds, events, self._due.at = kept
                del self._events[events:]
                raise StateNotSaved(f"cannot keep the change across a restart: {self.path}: "
                                    f"{exc.strerror or exc}; nothing changed (make the state directory "
                                    "writable, or free space on it)") from exc

    def _state(self) -> tuple:
        return self.active, dict(self.overrides), list(self.holds), len(self._events), dict(self._due.at)

    # -- what the loop reads each tick ---------------------------------------------------------------
    def expire(self, now_wall: float | None = None) -> list[Event]:
        """End holds and overrides whose time is up on the boot clock (``now_wall``: unused, the wall clock
        may have been stepped); returns the events (also queued ones: policy changes made by D-Bus calls
        since the last tick)."""
        events, self._events = self._events, []
        changed = False
        due = self._due.pop_due() if self._due.at else ()
        for hold in [h for h in self.holds if ("h", h.cookie) in due]:
            self.holds.remove(hold)
            changed = changed or hold.detached
            events.append(self._event("policy", hold.policy, f"hold {hold.cookie} on {hold.policy} timed out",
                                      cookie=hold.cookie))
        for knob_id in [k for k in self.overrides if ("o", k) in due]:
            del self.overrides[knob_id]
            changed = True
            events.append(self._event("policy", knob_id, f"override of {knob_id} expired"))
        if self._due.at and self._due.stepped():  # the wall clock was stepped: expiries shown and saved anew
            self.holds = [replace(h, expires=self._due.wall(("h", h.cookie), h.expires)) for h in self.holds]
            changed = True
        if changed:
            self._save()
        return events

    def override_values(self) -> dict[str, float]:
        return usable_overrides(self.overrides, self._knobs())

    def hold_names(self) -> list[str]:
        """Held policies, oldest first (the last wins)."""
        return [h.policy for h in self.holds] if self.holds else []  # no comprehension made per tick

    def status(self, states: Mapping[str, Mapping[str, str]]) -> PolicyStatus:
        return PolicyStatus(self.active, tuple(self.holds), states)

    def policies_changed(self, names: set[str], fallback: str) -> None:
        """After a reload: drop holds on vanished policies; fall back when the active one vanished."""
        for hold in [h for h in self.holds if h.policy not in names]:
            self.holds.remove(hold)
            self._events.append(self._event("policy", hold.policy, f"hold {hold.cookie} ended: policy "
                                            f"{hold.policy} no longer exists", cookie=hold.cookie))
        if self.active not in names and fallback in names:
            self._events.append(self._event("policy", self.active, f"policy {self.active} no longer exists; "
                                            f"active policy is now {fallback}"))
            self.active = fallback
        self._save()

    # -- DaemonControl ---------------------------------------------------------------------------------
    def list_policies(self) -> list[dict[str, Any]]:
        return [{**policy_info(n, p), "active": n == self.active}
                for n, p in sorted(self._policies().items())]

    def get_policy(self, name: str) -> dict[str, Any]:
        policy = self._policy(name)
        info = policy_info(name, policy)
        source = getattr(policy, "source", None)
        if source is None and info["path"]:
            try:
                source = Path(info["path"]).read_text(encoding="utf-8")
            except OSError:
                source = ""
        # references that select nothing on this machine (aithermctl policy set prints them)
        return {**info, "source": source or "", "warnings": self._warnings(policy)}

    def set_active_policy(self, name: str) -> None:
        self._policy(name)
        kept = self._state()
        if name != self.active:
            self._events.append(self._event("policy", name, f"active policy {self.active} → {name}",
                                            old=self.active, new=name))
            self.active = name
        self._save(kept)

    def hold_policy(self, policy: str, reason: str, timeout_s: float, owner: str, uid: int | None,
                    detached: bool, *, root: bool = False) -> int:
        self._policy(policy)
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidArgument(f"timeout_s must be ≥ 0 (0 = none), not {timeout_s}")
        if not root and len(self.holds) >= MAX_HOLDS:
            raise LimitExceeded(f"{MAX_HOLDS} holds are in force already; release one first "
                                "(holds: aithermctl status)")
        if not root and sum(1 for h in self.holds if h.uid == uid) >= MAX_HOLDS_PER_UID:
            raise LimitExceeded(f"uid {uid} has {MAX_HOLDS_PER_UID} holds already; release one first "
                                "(holds: aithermctl status)")
        now, kept = self._clock.wall(), self._state()
        cookie = self._cookie()
        expires = self._due.set(("h", cookie), timeout_s)
        hold = Hold(cookie, policy, reason, owner, uid, now, expires, detached)
        self.holds.append(hold)
        self._events.append(self._event("policy", policy, f"hold {cookie} on {policy}: {reason}",
                                        cookie=cookie, owner=owner))
        if detached:
            self._save(kept)
        return cookie

    def _cookie(self) -> int:
        used = {h.cookie for h in self.holds}
        while self._next_cookie in used or self._next_cookie == 0:
            self._next_cookie = self._next_cookie % COOKIE_MAX + 1
        cookie = self._next_cookie
        self._next_cookie = cookie % COOKIE_MAX + 1
        return cookie

    def hold_uid(self, cookie: int) -> int | None:
        """The uid that took hold ``cookie``; None when there is no such hold or it has no uid."""
        return next((h.uid for h in self.holds if h.cookie == cookie), None)

    def release_policy(self, cookie: int, by: int | None = None) -> None:
        hold = next((h for h in self.holds if h.cookie == cookie), None)
        if hold is None:
            raise UnknownCookie(f"no hold with cookie {cookie}")
        kept = self._state() if hold.detached else None  # a detached one unsaved would come back at a restart
        self.holds.remove(hold)
        who = f" by uid {by}" if by is not None else ""
        self._events.append(self._event("policy", hold.policy,
                                        f"hold {cookie} on {hold.policy} released{who}",
                                        cookie=cookie, **({} if by is None else {"by_uid": by})))
        if hold.detached:
            self._save(kept)

    def release_owner(self, owner: str) -> None:
        for hold in [h for h in self.holds if h.owner == owner and not h.detached]:
            self.holds.remove(hold)
            self._events.append(self._event("policy", hold.policy, f"hold {hold.cookie} ended: {owner} left",
                                            cookie=hold.cookie))

    def set_override(self, knob_id: str, value: float, seconds: float) -> float:
        """Returns the value applied: ``value``, or the nearest bound for a value just outside the knob's
        constraints (:meth:`Knob.edge_margin`)."""
        knob = self._knob(knob_id)
        if not knob.writable:
            raise InvalidArgument(f"{knob_id} is read-only: {knob.why_not or 'not writable'}")
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument(f"seconds must be ≥ 0 (0 = until cleared), not {seconds}")
        # kept across a restart: refused when it cannot be; a timed one is in force now whatever the disk says
        applied, kept = clamp_request(knob, value), self._state() if seconds == 0 else None
        self.overrides[knob_id] = (applied, self._due.set(("o", knob_id), seconds))
        asked = f" (asked {value:g} {knob.unit}, clamped to the knob's range)" if applied != value else ""
        warnings = override_warnings(knob, applied, seconds)
        self._events.append(self._event("policy", knob_id, f"override {knob_id} := {applied:g} {knob.unit}"
                                        + (f" for {seconds:g} s" if seconds > 0 else "") + asked
                                        + "".join(f"; warning: {w}" for w in warnings),
                                        value=applied, requested=value))
        self._save(kept)
        for warning in warnings:
            self._log.warning("override_stops_fan", knob=knob_id, message=warning)
        return applied

    def override_warnings(self, knob_id: str, value: float, seconds: float) -> list[str]:
        """What to tell whoever set ``knob_id`` to ``value`` for ``seconds`` (:func:`override_warnings`)."""
        knob = self._knobs().get(knob_id)
        return override_warnings(knob, value, seconds) if knob is not None else []

    def report_progress(self, gpus: list[str], rate: float) -> None:
        """A job's progress rate (steps/s) on ``gpus``, for 30 s (:mod:`aithermd.runtime.progress`).
        Raises InvalidArgument."""
        known = {k.device_id for k in self._knobs().values() if k.kind == KnobKind.POWER_LIMIT}
        self.progress.report(gpus, rate, self._clock.monotonic(), known)

    def progress_readings(self, now: float) -> Mapping[str, Any]:
        return self.progress.readings(now)

    def clear_override(self, knob_id: str) -> None:
        self._knob(knob_id)
        if self.overrides.pop(knob_id, None) is not None:
            self._events.append(self._event("policy", knob_id, f"override of {knob_id} cleared"))
            self._save()

    def reload(self) -> None:
        self._reload()

    async def release_gpu(self, device_id: str) -> str:
        if self._release is None:
            raise InvalidArgument("releasing a GPU needs the running daemon")
        return await self._release(device_id)

    def explain(self, knob_id: str) -> dict[str, Any]:
        """Each decided knob's value, layer, rule, reason and inputs; with its ``label`` (the admin's name)
        and its ``alarms`` (the knob's own — a conflict, a fan that cannot be controlled — and those of the
        fans it drives: stalled, empty) when it has them."""
        snap = self._hub.latest
        decisions = dict(snap.decisions) if snap is not None else {}
        alarms = dict(snap.alarms) if snap is not None else {}
        if knob_id:
            self._knob(knob_id)
            decisions = {knob_id: decisions[knob_id]} if knob_id in decisions else {}
        knobs = self._knobs()
        out: dict[str, Any] = {}
        for k, d in sorted(decisions.items()):
            entry: dict[str, Any] = {"value": d.value, "requested": d.requested, "layer": str(d.layer),
                                     "rule": d.rule, "reason": d.reason, "inputs": dict(d.inputs)}
            knob = knobs.get(k)
            if knob is not None and knob.label:
                entry["label"] = knob.label
            fans = knob.fan.tachs if knob is not None and knob.fan is not None else \
                ((knob.fan_channel,) if knob is not None and knob.fan_channel else ())
            mine = {i: alarms[i] for i in (k, *fans) if i in alarms}
            if mine:
                entry["alarms"] = {i: {"kind": a.kind, "message": a.message, "since": a.since}
                                   for i, a in mine.items()}
            out[k] = entry
        return out

    # -- helpers ---------------------------------------------------------------------------------------
    def _policy(self, name: str) -> Any:
        policies = self._policies()
        if name not in policies:
            raise UnknownPolicy(f"no policy {name!r}; known: {', '.join(sorted(policies)) or 'none'}")
        return policies[name]

    def _knob(self, knob_id: str) -> Knob:
        knobs = self._knobs()
        if knob_id not in knobs:
            raise UnknownKnob(f"no knob {knob_id!r}")
        return knobs[knob_id]

    def _event(self, kind: str, subject: str, message: str, **data: Any) -> Event:
        self._log.info(kind, subject=subject, message=message, **data)
        return Event(kind, self._clock.wall(), subject, message, data)


def range_text(lo: float | None, hi: float | None, unit: str) -> str:
    """Where a value fell outside a knob's range, in words, for a range that may be open at either end:
    "outside 150–600 W", "above the maximum 95 W", "below the minimum 30 %"."""
    if lo is not None and hi is not None:
        return f"outside {lo:g}–{hi:g} {unit}"
    if hi is not None:
        return f"above the maximum {hi:g} {unit}"
    return f"below the minimum {lo:g} {unit}"


def override_warnings(knob: Knob, value: float, seconds: float) -> list[str]:
    """The warnings an override of ``knob`` to ``value`` (its unit) for ``seconds`` (0: until cleared)
    comes with: a fan (pwm or GPU fan) set to 0 %, or under the duty its calibration found keeps it
    turning, with no end, stays stopped until the override is cleared; the safety layer still drives it
    to full on a critical temperature or a failed sensor."""
    if knob.kind not in (KnobKind.PWM, KnobKind.FAN) or seconds > 0:
        return []
    stop = knob.fan.stop_pct if knob.fan is not None and knob.fan.stop_pct is not None else 0.0
    if value > 0 and value >= stop:
        return []
    why = "0 %" if value <= 0 else f"{value:g} %, under the {stop:g} % that keeps it turning,"
    return [f"{knob.id} at {why} with no end: its fan stays stopped until `aithermctl override clear "
            f"{knob.id}` (a critical temperature or a failed sensor still drives it to full)"]


def clamp_request(knob: Knob, value: float) -> float:
    """An operator's ``value`` for ``knob``: itself inside the constraints, the nearest bound when just
    outside them (within :meth:`Knob.edge_margin`). Raises OutOfRange further out, InvalidArgument for a
    value that is no number."""
    if not math.isfinite(value):
        raise InvalidArgument(f"{knob.id}: {value!r} is not a number")
    applied = knob.clamp(value)
    if abs(applied - value) > knob.edge_margin():
        raise OutOfRange(f"{knob.id}: {value:g} {knob.unit} is {range_text(knob.min, knob.max, knob.unit)} "
                         f"(a value within {knob.edge_margin():g} {knob.unit} of it is clamped to it)")
    return applied
