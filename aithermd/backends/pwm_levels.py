"""What a driver keeps of each ``pwmN`` written, learnt from write → read-back pairs (:class:`Levels`).

- **Quantised duty.** dell_smm keeps 3 levels (0/128/255), thinkpad_acpi 8, amdgpu a whole percent: the
  read-back differs from the write. A read-back below the duty asked is written again one level up
  (:meth:`aithermd.backends.pwm.PwmKnob.write`), so a fan never gets less cooling than asked.
- **A read-back that does not follow the writes** (a driver or EC that answers 0, or one constant, to every
  read of ``pwmN``): each write then looked quantised to nothing, the round-up climbed to 255 at every
  write (three writes a tick) and the fan ran flat out while every report said the curve's duty. Once
  :data:`BLIND_AFTER` writes of different values in a row read back the same value, and those writes span
  at least :data:`BLIND_SPAN` raw or include full duty (255) read back as less than 255 − :data:`BLIND_SPAN`
  / 2, the read-back is taken as meaningless (:attr:`Levels.blind`): writes are trusted as they are, as
  lm-sensors' fancontrol and CoolerControl always do, and the duty reported is the one written. A driver
  whose read-back lags the write (it reports the ramping output) reads other values as the fan moves, so it
  never gets there; nor does a quantised one (its levels differ across such a span, and 255 reads 255), nor
  one whose constant is at or above every write (a two-speed fan reading full: the fan gets at least what was
  asked). A blind read-back that gives another value later is believed again.
- **A read-back that lags the write** (the driver reports the fan's ramping output, not the duty written):
  read again a moment later it reads nearer the write. Taking each lagging read for a level made the
  round-up write up to 10 values a tick and drive the fan toward 255 for a half-duty request. Once a sample
  read moves toward the last write with nothing written since (:meth:`Levels.settle`), the knob is
  :attr:`Levels.lagging`: one write per change, no read-back in the round-up, and a level is learnt only
  from a read-back that stayed put from one sample to the next.
"""

from __future__ import annotations

import structlog

from aithermd import units

# Different writes in a row that read back the very same value before the read-back counts as meaningless:
# 3 to 4 writes per round-up, so about three ticks of a curve that moves.
BLIND_AFTER = 10
# ... spanning at least this many raw steps: more than the widest level of a quantised driver (dell_smm's
# 3 levels: 0-63 → 0, 64-190 → 127/128; Documentation/hwmon/dell-smm-hwmon.rst).
BLIND_SPAN = 128


class Levels:
    """What a driver keeps of each ``pwmN`` written: ``seen`` maps a written raw value to its read-back;
    ``blind`` once the read-back is known not to follow the writes; ``lagging`` once it is known to trail
    them (the fan's ramping output); ``written``: the last raw value written (None before the first)."""

    __slots__ = ("seen", "quantised", "blind", "constant", "written", "lagging", "_same", "_low", "_high",
                 "_full_low", "_last", "_probe")

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.quantised = False
        self.blind = False
        self.constant: int | None = None  # the one value a blind read-back gives
        self.written: int | None = None
        self._same = 0  # different writes in a row that read back _last
        self._low = self._high = 0  # the span of those writes
        self._full_low = False  # one of them was full duty, read back far below it
        self._last: tuple[int, int] | None = None  # the last (written, read back)
        self.lagging = False
        # (written, read back) as last seen, by the write's own read-back or a sample since: None after a
        # write whose read-back was not taken (a lagging knob)
        self._probe: tuple[int, int | None] | None = None

    def learn(self, written: int, got: int) -> bool:
        """Record one write and its read-back. True when this pair shows the read-back is meaningless
        (:attr:`blind` became True now)."""
        last, self._last = self._last, (written, got)
        if last is not None and got == last[1] and written != last[0]:
            self._same += 1
            self._low, self._high = min(self._low, written), max(self._high, written)
        else:
            self._same, self._low, self._high, self._full_low = 0, written, written, False
        if written == units.PWM_MAX and got < units.PWM_MAX - BLIND_SPAN // 2:
            self._full_low = True
        if (self._same >= BLIND_AFTER and not self.blind and got < self._high
                and (self._high - self._low >= BLIND_SPAN or self._full_low)):
            self.blind, self.quantised, self.constant = True, False, got
            self.seen.clear()
            return True
        if self.blind:
            return False
        if len(self.seen) < 512:
            self.seen[written] = got
        if got != written:
            self.quantised = True
        return False

    def wrote(self, written: int, got: int | None) -> None:
        """The knob wrote ``written`` (raw) and read back ``got`` at once (None: not read back)."""
        self.written, self._probe = written, (written, got)

    def settle(self, raw: int) -> bool:
        """A sample read ``raw`` of the pwm with nothing written since the last :meth:`wrote`: a read-back
        that moved toward the write trails it (:attr:`lagging`, the levels learnt so far forgotten); on a
        lagging knob, one that stayed put since the last sample is learnt (:meth:`learn`). True when this
        read made the read-back count as meaningless (as :meth:`learn`)."""
        probe = self._probe
        if probe is None or probe[0] != self.written:
            return False
        written, before = probe
        self._probe = (written, raw)
        if before is None or raw == before:
            if not self.lagging or before is None:
                return False
            self._probe = None  # learnt once per write: a fan resting at a level is not a new pair each tick
            return self.learn(written, raw)
        toward = abs(raw - written) < abs(before - written) and (raw - before) * (written - before) > 0
        if toward and not self.lagging:
            self.lagging, self.quantised = True, False
            self.seen.clear()
        return False

    def unblind(self) -> None:
        """The read-back gave another value than its constant: it follows the writes again, learn anew."""
        self.blind, self.constant, self._same, self._last = False, None, 0, None

    def write_for(self, target: int) -> int:
        """The raw value to write for at least ``target``: the search :meth:`PwmKnob.write` makes (up from
        ``target`` past every write known to read back less), replayed over what was learned."""
        value = target
        if self.quantised:
            while value < units.PWM_MAX and (got := self.seen.get(value)) is not None and got < target:
                value = min(units.PWM_MAX, value + max(1, target - got))
        return value

    def holds(self, target: int) -> int:
        """The raw value the driver will hold for ``target`` (its learned level), ``target`` when unknown."""
        if not self.quantised:
            return target
        return self.seen.get(self.write_for(target), target)


def say_blind(knob_id: str, got: int) -> None:
    """Log once that ``knob_id``'s read-back is ignored (``pwm_readback_ignored``, warning)."""
    structlog.get_logger("aithermd.hwmon").warning(
        "pwm_readback_ignored", knob=knob_id, reads=got,
        message=f"{knob_id}: pwm reads back {got} whatever is written; writes are trusted as written and "
                "reported as the duty")
