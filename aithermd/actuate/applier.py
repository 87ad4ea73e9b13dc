"""Safe actuation: journal first, write, read back, detect drift, step back from a fight.

- **Journal first**: before the first write to a knob its original state goes to the journal (on disk);
  if that fails nothing is written.
- **Read back** after each write. A value that does not stick (the read-back differs from the request
  beyond the knob's resolution, or the mode is not manual) is *drift*, reported once per distinct case with
  the knob named (an enforced power limit below the requested one is :mod:`aithermd.actuate.caps`'s, every
  tick). A write refused with NoPermission before the knob was ever written leaves no journal entry; one
  refused is tried again (:mod:`aithermd.actuate.refusals`: a safety decision every tick, with an alarm).
- **Behind our back**: :meth:`Applier.observe` compares each tick's sampled value of an owned knob with the
  value read back after our last write; a change is drift (another fan controller such as fancontrol or
  CoolerControl, a BMC, the driver on resume). :data:`CONFLICT_COUNT` such changes within
  :data:`CONFLICT_WINDOW_S` mean another program keeps rewriting the knob: the applier *steps back* from
  *policy* decisions (stops writing them, reports a conflict: event, :attr:`Applier.alarms`, metric) instead
  of fighting. **Safety never steps back:** a safety decision (critical temperature, failed sensor, stalled
  fan) is written whatever the knob's drift, step-back or conflict state, every tick it does not hold. The
  journal entry stays, so the original is put back when the daemon stops.
- **Quantised knobs**: a pwm knob's ``settles_at(value)`` (hwmon's ``pwm_knob``: the driver's level at or
  above the duty asked) is what the read-back is compared with: a driver's rounding is neither drift nor a
  reason to write again. **Power limits the driver keeps its own way** (:func:`~aithermd.actuate.readback.
  limit_kept`): a safety cut read back at or below the target holds (a driver quantising to 25 W steps keeps
  it under; not the ceiling that lets a released cut rise, ``CEILING_RULE``); the limit the driver kept
  after the same value was written, still in place, is not written again.
- **Unreadable read-back**: a value the driver took (its write returned) on a power limit or clock lock that
  cannot be read back (limit getters answering NOT_SUPPORTED) is written again every :data:`UNREAD_RETRY_S`,
  not every tick (attack9 N7), without an ``actuation``; a new value, a safety decision's first, at once; on
  a resume, at once. A fan's safety duty is still written every tick (another program's writes unseen).
- **Refused manual mode**: a pwm knob's ``mode_refused`` (hwmon's ``pwm_knob``: a driver refusing
  ``pwmN_enable := 1``, the duty written on its own) is said once (a ``drift`` event, ``mode_refused``); the
  duty read back in the driver's mode is then the setting, not drift.
- **No-ops** are dropped (a value in place within resolution, mode manual). **Dry-run** logs each actuation
  it would make and writes nothing, not even the journal. **Paused** (:meth:`Applier.pause`, asleep):
  nothing is written or handed back and no drift counted until :meth:`Applier.resume`, nor for
  :data:`RESUME_GRACE_S` after it (firmware that resets fan control a moment after the resume).

Every method is synchronous (NVML knobs are driven from the loop's worker thread) and never raises for a
device fault: faults come back as :class:`~aithermd.model.Event` and in :attr:`Applier.faults`.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog

from aithermd.actuate.journal import Journal, JournalError
from aithermd.actuate.readback import (
    levels_of,
    limit_kept,
    mode_refused,
    same_setting,
    setting_held,
    settling,
    stuck,
    tolerance,
    trails,
    unread_wait,
    unreadable,
)
from aithermd.actuate.refusals import Refusals, denied
from aithermd.actuate.restore import restore_one
from aithermd.backends.base import Backend
from aithermd.errors import NoPermission
from aithermd.log import debug_enabled
from aithermd.model import Alarm, Decision, Event, Knob, KnobKind, KnobValue, Layer, Status
from aithermd.units import num, rounded

JOURNALED_KINDS = (KnobKind.POWER_LIMIT, KnobKind.SM_CLOCK_LOCK)  # every write logged at info
CONFLICT_COUNT = 3
CONFLICT_WINDOW_S = 60.0
FAN_KINDS = (KnobKind.PWM, KnobKind.FAN)
RETAKE_S = (600.0, 86_400.0)  # a knob stepped back from is taken again after 10 min, then 20, 40 ... up to a day
RESUME_GRACE_S = 30.0  # after a resume, firmware resetting fans late (SMU, EC): written over, not counted
UNREAD_RETRY_S = 30.0  # wall s: a value taken, its read-back failing, is written again this often
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")  # a fault's text less its numbers: the same fault at another value


@dataclass
class _Owned:
    device_id: str
    requested: float
    after: KnobValue | None = None
    behind: deque[float] = field(default_factory=deque)
    stuck: tuple[float, float | None, str | None] | None = None
    overridden: bool = False  # a safety write went over a step-back (reported once per step-back)
    retake: tuple[float, float] | None = None  # stepped back: (when to take it again, the wait after that)
    handed: dict[str, Any] | None = None  # stepped back from a fan: the original it was handed back to
    refused: str | None = None  # the driver refuses manual mode: the duty alone is written (said once)
    levels: Any = None  # a pwm's learnt Levels (readback.levels_of)
    taken: float | None = None  # wall s of the last write of ``requested`` taken with no read-back


class Applier:
    """Writes knobs for one daemon run. ``owned`` holds the knobs written (or, in dry-run, that would have
    been) and not handed back; ``stepped_back`` those left to another program (for policy decisions);
    ``faults`` knob id → the last write or read error, cleared by the next success; ``alarms`` knob id →
    :class:`~aithermd.model.Alarm` for what needs a person: ``conflict`` (stepped back), ``uncontrollable``
    (a fan whose driver refuses its mode and its duty), ``refused`` (:mod:`~aithermd.actuate.refusals`)."""

    def __init__(self, journal: Journal, *, dry_run: bool = False, conflict_count: int = CONFLICT_COUNT,
                 conflict_window_s: float = CONFLICT_WINDOW_S) -> None:
        self.journal, self.dry_run = journal, dry_run
        self.conflict_count, self.conflict_window_s = conflict_count, conflict_window_s
        self._owned: dict[str, _Owned] = {}
        self.stepped_back: set[str] = set()
        self.faults: dict[str, str] = {}
        self.alarms: dict[str, Alarm] = {}
        self.refusals = Refusals(self.alarms)  # writes refused permission, tried again
        self._log = structlog.get_logger("aithermd.actuate")
        self._who: dict[str, tuple[str, Any]] = {}  # knob → (rule, layer) of its last logged write
        self.paused = False
        self._grace_until = float("-inf")  # monotonic s: changes before this are the resume's (RESUME_GRACE_S)

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    def pause(self) -> None:
        """Stop writing (the machine is about to sleep): :meth:`apply`, :meth:`give_back` and
        :meth:`observe` do nothing until :meth:`resume`."""
        self.paused = True

    def resume(self, t_mono: float | None = None) -> None:
        """Write again. With ``t_mono`` (the machine woke up): for :data:`RESUME_GRACE_S` a change found
        on an owned knob is written over without counting it, and what was counted before is forgotten."""
        self.paused = False
        if t_mono is not None:
            self._grace_until = t_mono + RESUME_GRACE_S
            for own in self._owned.values():
                own.behind.clear()
                own.taken = None  # a value taken unreadable is written again at once

    # -- between ticks -------------------------------------------------------------------------------
    def observe(self, knob: Knob, kv: KnobValue | None, t_mono: float, t_wall: float) -> list[Event]:
        """Compare an owned knob's sampled state with what we left there; report drift, step back after
        repeated changes. Returns the events (none when nothing changed)."""
        own = self._owned.get(knob.id)
        if own is not None and knob.id in self.stepped_back and not self.paused:
            return self._retake(knob, own, t_mono, t_wall)
        if own is None or own.after is None or knob.id in self.stepped_back or self.paused:
            return []
        if kv is None or kv.status != Status.OK or kv.value is None or own.after.value is None:
            return []
        moved = abs(kv.value - own.after.value) > tolerance(knob, own.after.value)
        mode_changed = kv.mode != own.after.mode
        if not (moved or mode_changed):
            return []
        if not mode_changed and knob.kind in FAN_KINDS and settling(own.after.value, kv.value, own.requested,
                                                                    own.levels):
            own.after = kv  # the driver settling on what we asked (a ramping output): not drift
            return []
        if t_mono < self._grace_until:  # firmware still finishing its resume: written over, not counted
            own.after = None
            return []
        own.behind.append(t_mono)
        while own.behind and own.behind[0] < t_mono - self.conflict_window_s:
            own.behind.popleft()
        what = (f"mode {own.after.mode} → {kv.mode}" if mode_changed and not moved
                else f"{num(own.after.value)} → {num(kv.value)} {knob.unit}")
        events = [self._event("drift", t_wall, knob, own.device_id,
                              f"{knob.id} changed behind our back: {what}",
                              expected=own.after.value, got=kv.value, mode=kv.mode, why="changed")]
        own.after = None  # the next write (or a no-op that finds the value in place) sets it again
        if len(own.behind) >= self.conflict_count:
            self.stepped_back.add(knob.id)
            own.overridden = False
            wait = own.retake[1] if own.retake is not None else RETAKE_S[0]
            own.retake = (t_mono + wait, min(2 * wait, RETAKE_S[1]))
            message = (f"another program keeps rewriting {knob.id} ({len(own.behind)} changes in "
                       f"{self.conflict_window_s:g} s): stepping back, policy decisions are no longer "
                       f"written to it (safety decisions still are); taken again in {wait / 60:g} min")
            self.alarms[knob.id] = Alarm("conflict", message, t_wall)
            events.append(self._event("conflict", t_wall, knob, own.device_id, message,
                                      changes=len(own.behind), window_s=self.conflict_window_s))
        return events

    # -- one write -----------------------------------------------------------------------------------
    def _hand_back(self, backend: Backend, knob: Knob, t_wall: float) -> list[Event]:
        """A fan stepped back from goes back to its original once (never left manual); it stays owned."""
        own = self._owned.get(knob.id)
        if own is None or own.handed is not None or self.dry_run or self.paused or knob.id not in self.journal:
            return []  # not ours, handed back already, or nothing to hand back
        own.handed = dict(self.journal.entries()[knob.id].saved)  # journaled again as found, if written again
        try:
            note = restore_one(self.journal, backend, knob.id, to_writer=True)
        except Exception as exc:  # noqa: BLE001 - stays journaled; restored at exit
            return self._fault(t_wall, knob, own.device_id, "hand back", exc)
        return [self._event("restore", t_wall, knob, own.device_id,
                            f"{knob.id} handed back while stepped back: {note or 'original restored'}",
                            fallback=bool(note))]

    def _retake(self, knob: Knob, own: _Owned, t_mono: float, t_wall: float) -> list[Event]:
        """A knob stepped back from is taken again when its wait is over (:data:`RETAKE_S`)."""
        if own.retake is None or t_mono < own.retake[0]:
            return []
        self.stepped_back.discard(knob.id)
        self.alarms.pop(knob.id, None)
        own.behind.clear()
        own.after = None
        return [self._event("recovered", t_wall, knob, own.device_id, f"{knob.id}: taken again after stepping "
                            f"back; if another program still rewrites it, for {own.retake[1] / 60:g} min",
                            why="retake")]

    def unchanged(self, backend: Backend, knob: Knob, decision: Decision, value: float,
                  current: KnobValue | None, force: bool = False, t_wall: float | None = None) -> bool:
        """True when :meth:`apply` leaves ``knob`` as it is without a backend call (stepped back from, not
        writable (a safety decision is still tried on a knob refused permission), paused, already at
        ``value``, asked already without sticking, or taken unreadable under :data:`UNREAD_RETRY_S` before
        ``t_wall``), its bookkeeping done; the executor then has no worker hop to make for it."""
        safety = decision.layer == Layer.SAFETY
        if (knob.id in self.stepped_back and not safety) or self.paused \
                or not (knob.writable or (safety and denied(knob))):
            return True
        own = self._owned.get(knob.id)
        if force and own is not None and not self.dry_run:
            return False  # written again whatever the read-back says
        holds, any_mode = setting_held(backend, knob, value)  # one look-up of the backend's pwm knob
        if same_setting(knob, current, holds, any_mode=any_mode) \
                or limit_kept(knob, decision, value, current, own):
            if own is not None:
                if own.taken is not None:
                    own.stuck = None  # read back again: a new failure is said again
                own.requested, own.after, own.taken = value, current, None
            self.refusals.settled(knob.id)
            return True
        # asked already; it did not stick and was reported
        return (not safety and own is not None and own.after is not None and current == own.after
                and abs(own.requested - value) <= tolerance(knob, value)) \
            or unread_wait(knob, value, current, own, t_wall, UNREAD_RETRY_S)

    def apply(self, backend: Backend, knob: Knob, device_id: str, decision: Decision, value: float,
              current: KnobValue | None, t_wall: float,
              force: bool = False) -> tuple[KnobValue | None, list[Event]]:
        """Bring ``knob`` to ``value`` (daemon units, already clamped) for ``decision``; ``current`` is this
        tick's read-back; ``force`` writes even a value that reads as in place (a limit the driver reports
        but does not enforce). Returns the knob's state afterwards and the events. A safety decision is
        written even to a knob stepped back from, and again every tick it does not hold."""
        if knob.id in self.stepped_back and decision.layer != Layer.SAFETY and knob.kind in FAN_KINDS:
            return current, self._hand_back(backend, knob, t_wall)
        if self.unchanged(backend, knob, decision, value, current, force, t_wall) \
                or self.refusals.waits(knob, decision.layer == Layer.SAFETY, t_wall):
            return current, []
        safety = decision.layer == Layer.SAFETY
        own = self._owned.get(knob.id)
        if force and own is not None and not self.dry_run:
            current = None  # write it again whatever the read-back says
        old = current.value if current is not None else None
        again = own is not None and own.taken is not None and unreadable(current) \
            and abs(own.requested - value) <= tolerance(knob, value)  # taken before: no actuation
        if self.dry_run:
            if own is not None and abs(own.requested - value) <= tolerance(knob, value):
                return current, []  # logged when first decided; nothing was written to drift from
            self._owned.setdefault(knob.id, _Owned(device_id, value)).requested = value
            self._log_actuation(knob, device_id, decision, old, value, dry_run=True)
            return current, [self._actuation_event(t_wall, knob, device_id, decision, old, value)]
        events: list[Event] = []
        recorded = False
        try:
            if knob.id not in self.journal:
                handed = own.handed if own is not None else None
                saved = handed if handed is not None else backend.save_knob(knob.id)
                try:
                    self.journal.record(knob.id, device_id, backend.locator(), saved, t_wall)
                except JournalError as exc:
                    if not safety:
                        raise
                    # a safety value (full duty, the minimum limit) is safe to leave behind even after a crash
                    self.journal.hold(knob.id, device_id, backend.locator(), saved, t_wall)
                    events += self._fault(t_wall, knob, device_id, "journal (written anyway: safety)", exc)
                recorded = True
            if self.paused:  # paused while the original was read (a slow NVML call): write nothing
                return current, []
            backend.write_knob(knob.id, value)
        except Exception as exc:  # noqa: BLE001 - a device fault never ends the daemon
            if recorded and isinstance(exc, NoPermission) and own is None:
                try:  # refused before anything changed: no original to put back
                    self.journal.forget(knob.id)
                except Exception as err:  # noqa: BLE001 - JournalError: the entry stays, restoring it is harmless
                    self._log.warning("journal_forget_failed", knob=knob.id, error=str(err))
            self.refusals.failed(knob, decision, value, old, own is not None, exc, t_wall)
            return current, self._fault(t_wall, knob, device_id, "write", exc)
        self.refusals.settled(knob.id, "uncontrollable")
        own = self._owned.setdefault(knob.id, _Owned(device_id, value))
        own.requested, own.handed = value, None
        if safety and knob.id in self.stepped_back and not own.overridden:
            own.overridden = True
            events.append(self._event(
                "conflict", t_wall, knob, device_id,
                f"{knob.id}: {decision.rule} written over the program that keeps rewriting it: safety "
                "decisions are always written", rule=decision.rule, safety=True))
        if not again:
            self._log_actuation(knob, device_id, decision, old, value)
            events.append(self._actuation_event(t_wall, knob, device_id, decision, old, value))
        refused = mode_refused(backend, knob)
        if refused != own.refused:
            own.refused = refused
            if refused:
                events.append(self._event(
                    "drift", t_wall, knob, device_id,
                    f"{knob.id}: the driver refuses manual mode ({refused}): the duty is written on its own "
                    "and the driver's automatic control may override it", why="mode_refused", error=refused))
        try:
            after = backend.read_knob(knob.id)
        except Exception as exc:  # noqa: BLE001
            events.extend(self._fault(t_wall, knob, device_id, "read back", exc))
            own.after, own.taken = None, None if knob.kind in FAN_KINDS else t_wall
            return current, events
        self.faults.pop(knob.id, None)
        was, own.taken = own.taken, t_wall if unreadable(after) and knob.kind not in FAN_KINDS else None
        own.after, own.levels = after, levels_of(backend, knob)
        if trails(own.levels) or (was is not None and own.taken is not None):
            return after, events  # read at once it says nothing yet (observe follows it), or unreadable still
        if (drift := stuck(knob, own, after, setting_held(backend, knob, value)[0])) is not None:
            events.append(self._event("drift", t_wall, knob, device_id, drift[0], **drift[1]))
        return after, events

    @property
    def requested(self) -> dict[str, float]:
        """Knob id → the value last asked of each owned knob (daemon units)."""
        return {k: own.requested for k, own in self._owned.items()}

    # -- hand back -----------------------------------------------------------------------------------
    def give_back(self, backend: Backend, knob: Knob, t_wall: float) -> list[Event]:
        """No decision owns ``knob`` any more: put its journaled original back and forget it."""
        if self.paused:
            return []
        own = self._owned.pop(knob.id, None)
        self.stepped_back.discard(knob.id)
        self.refusals.drop(knob.id)
        self._who.pop(knob.id, None)
        if own is None:
            return []
        if self.dry_run or knob.id not in self.journal:
            self._log.info("give_back", knob=knob.id, device=own.device_id, dry_run=self.dry_run)
            return []
        try:
            note = restore_one(self.journal, backend, knob.id)
        except Exception as exc:  # noqa: BLE001 - stays journaled; restored at exit
            return self._fault(t_wall, knob, own.device_id, "give back", exc)
        self._log.info("give_back", knob=knob.id, device=own.device_id)
        return [self._event("restore", t_wall, knob, own.device_id,
                            f"{knob.id} handed back: {note or 'original restored'}", fallback=bool(note))]

    def unsettle(self, knob_id: str) -> None:
        """``knob_id`` was written outside :meth:`apply` (:mod:`~aithermd.actuate.rescue`): not drift."""
        if (own := self._owned.get(knob_id)) is not None:
            own.after = None  # the next no-op or write sets it again

    def forget(self, knob_id: str) -> None:
        """Drop all memory of a knob (after the journal was restored as a whole)."""
        self.stepped_back.discard(knob_id)
        self.refusals.drop(knob_id)  # and its alarm
        for table in (self._owned, self.faults, self._who):
            table.pop(knob_id, None)

    # -- reporting -----------------------------------------------------------------------------------
    def _log_actuation(self, knob: Knob, device_id: str, decision: Decision, old: float | None, new: float,
                       **extra: Any) -> None:
        """One ``actuation`` line per write, with its reason: at info when the knob's rule or layer changed
        (the first write too) or for a GPU's limit or clock lock (a search's steps), else at debug (a curve
        moving a fan every few s; every write is still an ``actuation`` event on the bus)."""
        who = (decision.rule, decision.layer)
        journaled = self._who.get(knob.id) != who or knob.kind in JOURNALED_KINDS
        self._who[knob.id] = who
        if not journaled and not debug_enabled():
            return
        (self._log.info if journaled else self._log.debug)(
            "actuation", device=device_id, knob=knob.id, old=rounded(old), new=rounded(new), unit=knob.unit,
            rule=decision.rule, layer=str(decision.layer), reason=decision.reason, **extra)

    def _actuation_event(self, t_wall: float, knob: Knob, device_id: str, decision: Decision,
                         old: float | None, new: float) -> Event:
        was = "?" if old is None else f"{num(old)}"
        message = f"{knob.id}: {was} → {num(new)} {knob.unit} ({decision.rule})"
        return Event("actuation", t_wall, knob.id, message,
                     {"device": device_id, "old": rounded(old), "new": rounded(new), "unit": knob.unit,
                      "rule": decision.rule, "layer": str(decision.layer), "dry_run": self.dry_run})

    def _event(self, kind: str, t_wall: float, knob: Knob, device_id: str, message: str,
               **data: Any) -> Event:
        level = self._log.error if kind in ("conflict", "fault") else self._log.warning
        if kind == "restore" and not data.get("fallback"):
            level = self._log.info
        level(kind, device=device_id, knob=knob.id, unit=knob.unit, message=message, **data)
        return Event(kind, t_wall, knob.id, message, {"device": device_id, "unit": knob.unit, **data})

    def _fault(self, t_wall: float, knob: Knob, device_id: str, action: str,
               exc: BaseException) -> list[Event]:
        """Record a fault; report it when it is new: the same error every tick is reported once, even while
        the value asked moves (a curve asking 41 %, then 42 %, of a fan whose writes are refused)."""
        why = f"{type(exc).__name__}: {exc}"
        before, self.faults[knob.id] = self.faults.get(knob.id, ""), why
        if _NUMBERS.sub("#", before) == _NUMBERS.sub("#", why):
            return []
        return [self._event("fault", t_wall, knob, device_id, f"{knob.id}: {action} failed: {why}",
                            action=action, error=why)]

