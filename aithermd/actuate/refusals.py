"""Writes refused permission, tried again (attack4 B5): "a safety decision is always written, every tick it
does not hold".

A knob whose write was refused with :class:`~aithermd.errors.NoPermission` is not given up:

- a **safety decision** is written again every tick while the knob is writable (NVML answers
  ``NO_PERMISSION`` for a moment to a knob that took writes before: the backend keeps it writable);
- a **policy** decision (override, hold, policy) waits a backoff (:data:`RETRY_S`: 2 s, doubling up to 60 s)
  after each refusal, so that a refusal that lasts is not a write storm;
- a knob read-only for a **permission** (:func:`denied`: its ``why_not`` names ``NO_PERMISSION``: a daemon
  without root, a container without CAP_SYS_ADMIN, a GPU whose driver refused every write) is still tried by
  a safety decision, with the same backoff; one that cannot be written for what it is (no ``pwmN_enable``, a
  function the driver lacks) is not.

The backoff runs on the ticks' wall time; a wall clock stepped back ends it (tried at once). While a safety
decision is refused on a knob the daemon has written (its value is the daemon's, not the one found: a limit
it raised, over a trip point) the applier holds a ``refused`` :class:`~aithermd.model.Alarm` on it, until a
write goes through or the knob is where a decision wants it.
"""

from __future__ import annotations

from aithermd.errors import NoPermission
from aithermd.model import Alarm, Decision, Knob, Layer
from aithermd.units import num

RETRY_S = (2.0, 60.0)
REFUSED = "refused"  # the alarm's kind


def denied(knob: Knob) -> bool:
    """Whether ``knob`` is read-only for a permission (a safety decision is still tried on it)."""
    return not knob.writable and "NO_PERMISSION" in (knob.why_not or "")


class Refusals:
    """Knob id → (wall s of its last refusal, the wait after it), and the alarms they raise."""

    def __init__(self, alarms: dict[str, Alarm]) -> None:
        self.alarms = alarms  # the applier's
        self._at: dict[str, tuple[float, float]] = {}

    def waits(self, knob: Knob, safety: bool, t_wall: float) -> bool:
        """True when a write to ``knob`` now waits its backoff (see the module doc)."""
        at = self._at.get(knob.id)
        if at is None or (safety and knob.writable):
            return False
        return at[0] <= t_wall < at[0] + at[1]

    def failed(self, knob: Knob, decision: Decision, value: float, old: float | None, written: bool,
               exc: BaseException, t_wall: float) -> None:
        """A write of ``value`` for ``decision`` failed with ``exc`` (``old``: the knob's value, ``written``:
        the daemon has written the knob). Refused permission: back off, and raise the alarm for a safety
        decision on a knob the daemon has written; a fan whose driver refuses its mode and its duty
        (``Uncontrollable``): the ``uncontrollable`` alarm."""
        if type(exc).__name__ == "Uncontrollable" and knob.id not in self.alarms:
            self.alarms[knob.id] = Alarm("uncontrollable", str(exc), t_wall)
        if not isinstance(exc, NoPermission):
            return
        safety = decision.layer == Layer.SAFETY
        at = self._at.get(knob.id)
        self._at[knob.id] = (t_wall, RETRY_S[0] if at is None else min(2.0 * at[1], RETRY_S[1]))
        if safety and written and knob.id not in self.alarms:
            message = (f"{knob.id}: the safety decision {decision.rule} ({num(value)} {knob.unit}) is "
                       f"refused ({exc}); the knob stays at the daemon's {num(old)} {knob.unit}; tried again "
                       "every tick")
            self.alarms[knob.id] = Alarm(REFUSED, message, t_wall)

    def settled(self, knob_id: str, *kinds: str) -> None:
        """A write went through, or the knob is where a decision wants it: nothing is refused any more, and
        the alarm saying so (or one of ``kinds``: ``uncontrollable``) ends."""
        self._at.pop(knob_id, None)
        alarm = self.alarms.get(knob_id)
        if alarm is not None and alarm.kind in (REFUSED, *kinds):
            del self.alarms[knob_id]

    def drop(self, knob_id: str) -> None:
        """The knob is handed back or forgotten: its backoff and any alarm on it go."""
        self._at.pop(knob_id, None)
        self.alarms.pop(knob_id, None)
