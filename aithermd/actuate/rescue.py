"""One try at full duty for the fans the daemon holds on a chip that stops answering (attack12 W1r-res).

A chip the read guard holds as hung is not written nor read back on the loop (:mod:`aithermd.actuate.hung`):
one lock in its driver may block either for ever. But a fan the daemon holds there is in *manual* mode at
the duty the daemon last asked, maybe a low one, and stays so while the chip does not answer, whatever the
temperatures. When only a read hangs (a stuck ``pwm1`` attribute; attack12 saw six fans frozen at 34-47 % with
Tctl at 90 °C), its writes still get through. The product's third rule (a sensor confirmed failed drives
its fans to full, never zero; a single glitch does not) then asks for a try. So when a device has been held
for a hung *read* for :data:`AFTER_S` without a break, each fan knob of it that the daemon owns and has
journaled gets **one** write of full duty for that hold:

- not at once: a chip merely slow (a read of 0.7 s, over the guard's 0.5 s deadline) is held until that read
  returns, a tick or two, and would get a burst of full duty at each overrun (safety13's ``slowhold.py``: 2-4
  bursts of 255 in 30-40 s). A read that has not returned within :data:`AFTER_S` is a hang, as a sensor's
  suspect value stands in for at most that long before it counts as failed
  (:attr:`aithermd.backends.trust.TrustOptions.max_hold_s`);

- off the loop, in a thread of its own per fan (``aithermd-rescue``), never waited for: the loop, the stop
  and the other fans never wait on it. Not the inline writer thread: a rescue that hangs there would hold
  every later batch of every other device behind it;
- write only, nothing read: hwmon's full duty of the restore (:func:`aithermd.backends.pwm_restore.full`:
  ``pwmN_enable`` 1, ``pwmN`` 255 or the driver's full-speed mode), else ``write_knob`` of the knob's top;
- the journal is left as it is (those knobs were journaled before their first write): the final restore
  and ``aithermd restore`` still put the originals back. A write given up on (still inside the driver) is
  not tried again while it has not returned; nothing is started once the executor is closed or paused;
- a fan not owned (never written, so its original was never read) is not touched: its original could not
  be journaled without a read of the chip.

A device held only for a hung *write* (:mod:`aithermd.actuate.inline`; its reads answer) gets no try: its
writes block. One the read guard holds as well does (the batch given up on may have hung in its read-back).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any

import structlog

from aithermd.actuate.applier import FAN_KINDS, Applier
from aithermd.backends.base import Backend
from aithermd.backends.pwm_restore import full
from aithermd.backends.trust import TrustOptions
from aithermd.errors import UnknownKnob
from aithermd.model import Event, Knob
from aithermd.policy.safety import FULL_PCT

THREAD_NAME = "aithermd-rescue"
AFTER_S = TrustOptions().max_hold_s  # s held without a break before the try: how long a glitch may last (3 s)

_log = structlog.get_logger("aithermd.rescue")


def full_duty(backend: Backend, knob: Knob) -> str | None:
    """Write ``knob`` (a fan) to full duty without reading it: hwmon's restore fallback (manual 255, else the
    full-speed mode), else ``write_knob`` of the knob's top. Returns the fallback's note; raises its error."""
    pwm_of = getattr(backend, "pwm_knob", None)
    if pwm_of is not None:
        try:
            pwm = pwm_of(knob.id)
        except UnknownKnob:
            pwm = None
        if pwm is not None:
            return full(pwm, f"{knob.id}: its chip does not answer")
    backend.write_knob(knob.id, knob.clamp(FULL_PCT))
    return None


class Rescue:
    """The full-duty tries (see the module doc); ``pending`` knob id → the future of its try not yet
    returned; ``held`` device id → when (monotonic s) its hold without a break began; ``tried`` the held
    devices whose try was made in this hold; ``after_s`` the hold before a try (:data:`AFTER_S`)."""

    def __init__(self, write: Callable[[Backend, Knob], Any] = full_duty, after_s: float = AFTER_S) -> None:
        self.write, self.after_s = write, after_s
        self.pending: dict[str, Future[Any]] = {}
        self.held: dict[str, float] = {}
        self.tried: set[str] = set()

    def start(self, world: Any, applier: Applier, hung: Collection[str], t_wall: float, t_mono: float,
              stop: Callable[[], bool]) -> list[Event]:
        """A try at full duty for each fan knob of ``world`` (``knobs``, ``owner``) that ``applier`` owns and
        has journaled on a device of ``hung`` (held by the read guard now) held without a break since
        ``after_s`` before ``t_mono`` (monotonic s) and not tried in this hold, unless one is still pending;
        ``stop()`` True starts none (the executor closed, asleep; tried later if still held). Returns a
        ``fault`` event per device tried (``why`` ``unanswered_full``)."""
        held, tried = self.held, self.tried
        for device in [d for d in held if d not in hung]:  # released: a later hold is a new one
            del held[device]
            tried.discard(device)
        for device in hung:
            held.setdefault(device, t_mono)
        new = {d for d, since in held.items() if d not in tried and t_mono - since >= self.after_s}
        if not new or stop():
            return []
        tried |= new
        knobs, owner, journal = world.knobs, world.owner, applier.journal
        todo: dict[str, list[str]] = {}
        for knob_id in sorted(applier.owned):
            knob = knobs.get(knob_id)
            if knob is None or knob.device_id not in new or knob.kind not in FAN_KINDS or not knob.writable \
                    or knob_id not in journal or knob_id not in owner or knob_id in self.pending:
                continue
            todo.setdefault(knob.device_id, []).append(knob_id)
            applier.unsettle(knob_id)  # what it reads once its chip answers again is no drift
            future: Future[Any] = Future()
            self.pending[knob_id] = future
            threading.Thread(target=self._run, args=(future, owner[knob_id], knob, stop), name=THREAD_NAME,
                             daemon=True).start()
        events = []
        for device, ids in todo.items():
            message = (f"{device}: its chip does not answer: one try at full duty, off the loop, for the "
                       f"fans the daemon holds there ({', '.join(ids)})")
            _log.error("fault", subject=device, message=message, why="unanswered_full", knobs=ids)
            events.append(Event("fault", t_wall, device, message, {"why": "unanswered_full", "knobs": ids}))
        return events

    def _run(self, future: Future[Any], backend: Backend, knob: Knob, stop: Callable[[], bool]) -> None:
        try:
            if stop():
                future.set_result(None)
                return
            note = self.write(backend, knob)
        except BaseException as exc:  # noqa: BLE001 - logged: nobody waits for it
            _log.error("unanswered_full_failed", knob=knob.id, error=f"{type(exc).__name__}: {exc}")
            future.set_exception(exc)
        else:
            _log.warning("unanswered_full_written", knob=knob.id, note=note)
            future.set_result(note)
        finally:
            if self.pending.get(knob.id) is future:
                del self.pending[knob.id]
