"""Sensor trust: what a reading is worth given the channel's history — calm on noise, fast on real danger.

Real sensors glitch: an i2c read fails once with ``EIO``, a driver answers ``ENODATA`` while the chip
converts, a diode reads −128 °C or 127 °C for one sample, a value jumps 80 °C in a second and back. Taken
as they come, each of these sends fans to full (and, with a slow ramp-down, keeps them loud for a minute);
ignored, a real failure or a real rise goes unanswered. :class:`SensorTrust` sits between the sample and
the engine and decides, per channel, with a stated bound:

- **Transient faults** (a transient errno, :data:`aithermd.backends.sysfs.TRANSIENT`, or NVML's timeout;
  an implausible value such as a sentinel or a torn read) are *held*: the engine sees the last good value
  (status ok, ``detail`` ``"held: ..."``) while that value is at most :attr:`TrustOptions.max_hold_s` old
  and fewer than :attr:`TrustOptions.confirm_reads` bad reads came in a row.
- **One overrun of the read guard** (a device's reading ``stale`` with the guard's ``read hung: ...``:
  its read did not answer within the deadline at this pass) is a transient fault too, held the same way:
  a chip slow once is a glitch (attack13 A3: one 0.7 s read of Tctl sent the board fans to full, then a
  minute of ramp-down), while a chip still hung at the next reading is confirmed. A device the guard holds
  for a back-off (``read slow: ...``: it overran at each of its last passes) is stale as it comes.
- **Persistent faults** (``ENODEV``, ``ENOENT``, ``EACCES``, a lost GPU, any errno not known to
  be transient) and **confirmed** ones (``confirm_reads`` bad reads in a row, or a last good value too old
  to carry) pass through as they are: the safety layer drives the channel's fans to full.
- **A GPU die against its own draw** (:mod:`aithermd.backends.diewatch`): a temperature colder than its
  draw allows, or unchanged while its draw moved by a step that moves any die, is implausible — held once
  like any implausible value, then confirmed (attack5 C1: a reading frozen at 30 °C released a cut).
- **Spikes**: an ok value that moved faster than its channel type can
  (:func:`aithermd.backends.plausible.rate_limit`, over at least ``MIN_DT_S``) is held the same way; the
  next reading decides — still that far from the last good value: the rise is real and is taken at once;
  back near it: the spike is dropped.

The bound (documented in docs/design.md and checked in tests/backends/test_sensor_trust.py): a failure, a
sentinel or a real rise reaches the engine and its safety layer at the latest with the
``confirm_reads``-th consecutive reading (the 2nd by default) and never more than ``max_hold_s`` (3 s)
after the last good reading; with ticks longer than that nothing is held at all. The critical path has no
other smoothing. Other stale readings (a device held for a back-off) and missing capabilities pass through.

Cost: per ok reading one dict lookup for the rate limit and two dict stores; the slow path only for
suspect readings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from aithermd.backends.diewatch import DieWatch
from aithermd.backends.plausible import MIN_DT_S, rate_limit
from aithermd.backends.sysfs import TRANSIENT
from aithermd.model import HELD, Device, Reading, Status

TRANSIENT_DETAILS = TRANSIENT | {"NVML_ERROR_TIMEOUT"}
READ_HUNG = "read hung:"  # the read guard's detail of a device whose read overran (guard.ReadGuard._hung)
_OK, _FAILED, _IMPLAUSIBLE, _STALE = Status.OK, Status.FAILED, Status.IMPLAUSIBLE, Status.STALE


@dataclass(frozen=True, slots=True)
class TrustOptions:
    """``confirm_reads``: consecutive suspect readings that confirm a failure or a rise (≥ 1; 1 trusts every
    reading as it comes); ``max_hold_s``: the oldest last good value that may stand in for a suspect one
    (s)."""

    confirm_reads: int = 2
    max_hold_s: float = 3.0

    def __post_init__(self) -> None:
        if self.confirm_reads < 1 or not 0 <= self.max_hold_s <= 60:
            raise ValueError("confirm_reads must be ≥ 1 and max_hold_s within 0–60 s")


def transient(reading: Reading) -> bool:
    """True when ``reading`` is a fault worth holding: an implausible value, a failure whose detail
    names a transient errno or NVML timeout, or a stale reading of a device whose read overran the read
    guard's deadline (not one held for a back-off)."""
    if reading.status is _IMPLAUSIBLE:
        return True
    detail = reading.detail
    if reading.status is _STALE:
        return detail is not None and detail.startswith(READ_HUNG)
    return reading.status is _FAILED and detail is not None and detail.split(":", 1)[0] in TRANSIENT_DETAILS


class SensorTrust:
    """Per-channel history and the verdict on each reading (see the module doc). ``configure(devices)``
    once per device set; ``filter(t, readings)`` once per tick with the monotonic time ``t`` (s)."""

    def __init__(self, options: TrustOptions | None = None) -> None:
        self.options = options or TrustOptions()
        self._limits: dict[str, float] = {}
        self._last_v: dict[str, float] = {}
        self._last_t: dict[str, float] = {}
        self._suspect: dict[str, tuple[int, float | None]] = {}  # channel → (suspect reads in a row, value)
        self._quiet: set[str] = set()  # suspect channels of a device whose read overran: the guard logs it
        # the channels whose reading :meth:`filter` handed back last is not ok (a by-product of its loop, so
        # that the health check need not look at every reading again)
        self.not_ok: list[str] = []
        self._die = DieWatch()
        self._log = structlog.get_logger("aithermd.trust")

    def configure(self, devices: Iterable[Device]) -> None:
        """Rate limits for the channels of ``devices``; history of channels no longer there is dropped."""
        devices = tuple(devices)
        limits: dict[str, float] = {}
        for d in devices:
            driver = "nvml" if d.kind == "gpu" else d.name
            for c in d.channels:
                limit = rate_limit(c.quantity, driver)
                if limit is not None:
                    limits[c.id] = limit
        self._limits = limits
        self._die.configure(devices)
        known = {c.id for d in devices for c in d.channels}
        for table in (self._last_v, self._last_t, self._suspect):
            for cid in [c for c in table if c not in known]:
                del table[cid]
        self._quiet &= known

    def filter(self, t: float, readings: Mapping[str, Reading]) -> Mapping[str, Reading]:
        """The readings the engine should see at monotonic time ``t``: ``readings`` itself when every one is
        trusted as it is, else a copy with held and confirmed readings replaced. :attr:`not_ok` lists then
        the channels whose returned reading is not ok, in ``readings`` order."""
        out: dict[str, Reading] | None = None
        not_ok: list[str] = []
        if self._die.pairs and (judged := self._die.judge(t, readings)):
            readings = {**readings, **judged}
            out = dict(readings)
        last_v, last_t, limits, suspect = self._last_v, self._last_t, self._limits, self._suspect
        for cid, r in readings.items():
            status = r.status
            if status is _OK:
                v = r.value
                prev = last_v.get(cid)
                # an unchanged value cannot be a spike: the rate check only for a value that moved
                if (prev is not None and v is not None and v != prev
                        and (limit := limits.get(cid)) is not None):
                    dt = t - last_t[cid]
                    if abs(v - prev) > limit * (dt if dt > MIN_DT_S else MIN_DT_S):
                        judged = self._spike(cid, r, prev, t)
                        if judged is not r:
                            out = dict(readings) if out is None else out
                            out[cid] = judged
                        continue
                if suspect and cid in suspect:
                    self._recovered(cid)
                if v is not None:
                    last_v[cid] = v
                    last_t[cid] = t
            elif status is _FAILED or status is _IMPLAUSIBLE or (
                    status is _STALE and r.detail is not None and r.detail.startswith(READ_HUNG)):
                judged = self._fault(cid, r, t)
                if judged is not r:
                    out = dict(readings) if out is None else out
                    out[cid] = judged
                if judged.status is not _OK:
                    not_ok.append(cid)
            else:
                not_ok.append(cid)
        self.not_ok = not_ok
        return readings if out is None else out

    # -- the slow paths --------------------------------------------------------------------------------
    def _hold(self, cid: str, t: float, why: str, value: float | None, quiet: bool = False) -> Reading | None:
        """A held reading (last good value) for suspect reading number n, or None when it cannot be held.
        ``quiet``: not logged (a read that overran: the read guard's ``read_hung`` says it once a device)."""
        n = self._suspect.get(cid, (0, None))[0] + 1
        age = t - self._last_t.get(cid, float("-inf"))
        opts = self.options
        if cid not in self._last_v or n >= opts.confirm_reads or age > opts.max_hold_s:
            self._suspect.pop(cid, None)
            self._quiet.discard(cid)
            return None
        self._suspect[cid] = (n, value)
        if quiet:
            self._quiet.add(cid)
        elif n == 1:
            self._log.warning("sensor_held", channel=cid, why=why)
        return Reading(cid, self._last_v[cid], _OK,
                       f"{HELD}{why}; last good value {age:.3g} s old, read {n} of {opts.confirm_reads}")

    def _spike(self, cid: str, r: Reading, prev: float, t: float) -> Reading:
        assert r.value is not None
        dt = t - self._last_t[cid]
        why = (f"{r.value:g} jumped from {prev:g} in {dt:.3g} s, faster than {self._limits[cid]:g}/s: "
               "awaiting confirmation")
        held = self._hold(cid, t, why, r.value)
        if held is not None:
            return held
        self._log.warning("sensor_rise_confirmed", channel=cid, value=r.value, previous=prev)
        self._last_v[cid], self._last_t[cid] = r.value, t
        return r

    def _fault(self, cid: str, r: Reading, t: float) -> Reading:
        if not transient(r):
            self._suspect.pop(cid, None)
            self._quiet.discard(cid)
            return r
        held = self._hold(cid, t, f"{r.status}: {r.detail or 'no value'}", None, r.status is _STALE)
        if held is not None:
            return held
        if cid in self._last_v:  # confirmed: no good value to carry any more
            self._log.error("sensor_fault_confirmed", channel=cid, status=str(r.status), detail=r.detail)
            del self._last_v[cid], self._last_t[cid]
        return r

    def _recovered(self, cid: str) -> None:
        n, _ = self._suspect.pop(cid)
        if self._quiet and cid in self._quiet:
            self._quiet.discard(cid)
            return
        self._log.info("sensor_trusted_again", channel=cid, suspect_reads=n)
