"""The one apply path: every write the daemon makes — the tick's, the resume re-apply's, the fast lane's.

:meth:`Executor.apply` takes decisions (knob id → :class:`~aithermd.model.Decision`, daemon units) and for
each knob: clamps the value to the knob's own constraints, reads the knob first when the caller has no
fresh value, then hands it to the :class:`~aithermd.actuate.applier.Applier` (journal first, write, read
back, drift, no-op). A device whose chip does not answer (its reads hang: ``Executor.unanswered``,
:mod:`aithermd.actuate.hung`) is not touched at all. Knobs of inline backends (hwmon, powercap) already in
place are settled on the loop, the others written in the writer thread under a deadline per knob
(:mod:`aithermd.actuate.inline`: a write that hangs holds its device); those of
threaded ones (NVML) in one job on the loop's :class:`~aithermd.actuate.worker.Worker`, awaited under a
budget. Knobs no decision claims any more are handed back (their journaled original restored) first. When
the threaded knobs lower a power limit, the inline ones that raise one (a budget moving watts from a GPU to
the CPU package) are written after the worker's job returns, and left for the next tick when it is late:
the limits in force never add up to more than the budget, even for a tick (a sim budget test saw 1 tick of
1200 over on a loaded machine).

Every job on the worker that writes is tracked until it returns, with the knob it is writing at that
moment. :meth:`Executor.settle` waits for them (suspend); :meth:`Executor.close` stops every later write
(queued jobs and the rest of a running one write nothing more) and waits for them with a deadline. A write
that has not returned by then is *abandoned*: :meth:`Executor.close` names its knob, so that the final
restore rewrites it last, keeps its journal entry while the write may still land, and rewrites it again
once the write returned (:meth:`Executor.returned`). The restore therefore wins: a late NVML write can
no longer land after the final restore unnoticed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import structlog

from aithermd.actuate.applier import Applier
from aithermd.actuate.hung import Unanswered
from aithermd.actuate.inline import InlineWrites, rest
from aithermd.actuate.rescue import Rescue
from aithermd.actuate.restore import RestoreReport, restore_journal
from aithermd.actuate.worker import Worker
from aithermd.backends.base import Backend
from aithermd.model import Decision, Event, Knob, KnobValue
from aithermd.policy.safety import POWER_KINDS


def _cuts(knobs: Mapping[str, Knob], wanted: Sequence[tuple[str, Decision]],
          current: Mapping[str, KnobValue] | None) -> bool:
    """Whether ``wanted`` lowers a power limit (or may: its value now unknown)."""
    for knob_id, dec in wanted:
        if knobs[knob_id].kind in POWER_KINDS:
            kv = current.get(knob_id) if current is not None else None
            if kv is None or kv.value is None or knobs[knob_id].clamp(float(dec.value)) < kv.value:
                return True
    return False


def _raises(knobs: Mapping[str, Knob], wanted: Sequence[tuple[str, Decision]],
            current: Mapping[str, KnobValue] | None) -> list[tuple[str, Decision]]:
    """The items of ``wanted`` that raise a power limit above what it reads now."""
    out = []
    for item in wanted:
        knob = knobs[item[0]]
        kv = current.get(item[0]) if current is not None else None
        if knob.kind in POWER_KINDS and kv is not None and kv.value is not None \
                and knob.clamp(float(item[1].value)) > kv.value:
            out.append(item)
    return out


class Knobs(Protocol):
    """What the apply path needs of the world: ``knobs`` (id → Knob), ``owner`` (knob id → backend) and the
    ``inline`` backends (the others are threaded)."""

    @property
    def knobs(self) -> Mapping[str, Knob]: ...

    @property
    def owner(self) -> Mapping[str, Backend]: ...

    @property
    def inline(self) -> tuple[Backend, ...]: ...


class Result(NamedTuple):
    """One knob's outcome: ``value`` asked (clamped, daemon units), its state ``before`` and ``after``
    (None when unreadable)."""

    knob_id: str
    value: float
    before: KnobValue | None
    after: KnobValue | None


@dataclass
class Applied:
    """What :meth:`Executor.apply` did: the ``events``, the knobs' values read back ``after`` (by knob id),
    one :class:`Result` per decision applied, and the ``late`` knob ids of threaded backends whose job did
    not answer within the budget (or could not be queued: the worker busy, the executor closed)."""

    events: list[Event] = field(default_factory=list)
    after: dict[str, KnobValue] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    late: list[str] = field(default_factory=list)


class _Job:
    """One batch of writes (on the worker, or the inline writer thread); ``writing``: the knob inside a
    backend call right now, since monotonic ``since`` (s); ``cut``: given up on, it writes nothing more;
    ``stuck``: the knob it was given up on in; ``hung``: the device of a write given up on (tracked alone)."""

    __slots__ = ("knobs", "writing", "since", "cut", "stuck", "hung", "future")

    def __init__(self, knobs: Sequence[str]) -> None:
        self.knobs = tuple(knobs)
        self.writing: str | None = None
        self.since = 0.0
        self.cut = False
        self.stuck: str | None = None
        self.hung: str | None = None
        self.future: asyncio.Future[Any] | None = None


class Executor:
    """The apply path of one daemon run over ``applier`` and ``worker`` (see the module doc)."""

    def __init__(self, applier: Applier, worker: Worker) -> None:
        self.applier = applier
        self.worker = worker
        self.closed = False
        self.applies = 0  # calls of apply(): a read taken before one may no longer hold (Tick.ahead)
        self._jobs: set[_Job] = set()
        self._abandoned: dict[str, _Job] = {}
        self.unanswered = Unanswered()  # devices whose chip does not answer: never written (hung.py)
        self.inline = InlineWrites()  # the inline knobs' writer thread (inline.py)
        self.rescue = Rescue()  # one try at full duty for the fans of a chip that stops answering (rescue.py)
        self._log = structlog.get_logger("aithermd.execute")

    def hold(self, world: Knobs, hung: Mapping[str, str], t_wall: float, t_mono: float) -> list[Event]:
        """Take ``hung`` (device id → why: held by the read guard now) as the devices not to touch
        (:meth:`Unanswered.update`); the fans this daemon holds on one held for a hung read for
        :data:`~aithermd.actuate.rescue.AFTER_S` get one try at full duty, off the loop
        (:mod:`aithermd.actuate.rescue`). ``t_wall``: epoch s, ``t_mono``: monotonic s. Returns the events."""
        applier = self.applier
        events = self.unanswered.update(hung, t_wall)
        return events + self.rescue.start(world, applier, hung, t_wall, t_mono,
                                          lambda: self.closed or applier.paused)

    # -- writing -----------------------------------------------------------------------------------------
    async def apply(self, world: Knobs, decisions: Iterable[tuple[str, Decision]], *, t_wall: float,
                    back: Sequence[str] = (), current: Mapping[str, KnobValue] | None = None,
                    threaded: bool = True, budget_s: float | None = None,
                    force: frozenset[str] | set[str] = frozenset()) -> Applied:
        """Hand back ``back`` (knob ids), then bring each knob of ``decisions`` to its decision's value.
        ``current``: this tick's sampled values (None: each knob is read first); ``threaded``: False skips
        the threaded backends' knobs (their sample did not answer); ``budget_s``: how long the worker job is
        awaited (default the worker's budget); ``force``: knobs written again even when they read as in
        place (:mod:`aithermd.actuate.caps`). The knobs of a device whose chip does not answer
        (``unanswered``, :mod:`aithermd.actuate.hung`) are left alone. Never raises for a device fault."""
        out = Applied()
        self.applies += 1
        if self.closed:
            out.late = [k for k, _ in decisions] + list(back)
            return out
        knobs, owner, inline = world.knobs, world.owner, world.inline
        if self.unanswered.devices:  # a chip that does not answer is not written nor read (hung.py)
            decisions, back = self.unanswered.drop(knobs, decisions, back)
        here: list[tuple[str, Decision]] = []
        there: list[tuple[str, Decision]] = []
        for item in decisions:
            if item[0] in knobs and item[1].value is not None:
                (here if owner[item[0]] in inline else there).append(item)
        back_here = [k for k in back if owner[k] in inline] if back else []  # none made on the usual tick
        back_there = [k for k in back if owner[k] not in inline] if back else []
        later = _raises(knobs, here, current) if there and _cuts(knobs, there, current) else []
        if later:  # a budget holds only if power comes down before it goes up elsewhere (module doc)
            here = [item for item in here if item not in later]
        self._inline(world, here, back_here, current, t_wall, out, force)
        if there and current is not None and threaded:
            there = self._in_place(world, there, current, out, force, t_wall)  # no worker hop for those
        if not (there or back_there) or not threaded:
            if later and threaded:
                self._inline(world, later, [], current, t_wall, out, force)
            elif later:
                out.late = [k for k, _ in later]
            return out
        now = None if current is None else {**current, **out.after}
        job = _Job([k for k, _ in there] + back_there)
        result = await self.worker.hop(self._batch, world, there, back_there, now, t_wall, job, None, force,
                                       budget_s=budget_s, submitted=lambda f: self._track(job, f))
        if result is None:
            out.late = list(job.knobs) + [k for k, _ in later]  # a raise waits for the cuts that are late
        else:
            self._merge(out, result)
            self._inline(world, later, [], current, t_wall, out, force)
        return out

    def _in_place(self, world: Knobs, wanted: Sequence[tuple[str, Decision]],
                  current: Mapping[str, KnobValue], out: Applied, force: frozenset[str] | set[str],
                  t_wall: float, fans: bool = False) -> list[tuple[str, Decision]]:
        """The decisions of ``wanted`` whose knob this tick's read-back does not show in place (the others
        are applied here, as the applier would have in the worker: a limit decided every tick, unchanged,
        costs no thread hop)."""
        left = []
        stepped_back = self.applier.stepped_back if fans else ()
        for knob_id, decision in wanted:
            backend, knob = world.owner[knob_id], world.knobs[knob_id]
            value = knob.clamp(float(decision.value))
            before = current.get(knob_id)
            if knob_id not in stepped_back and \
                    self.applier.unchanged(backend, knob, decision, value, before, knob_id in force, t_wall):
                if before is not None:
                    out.after[knob_id] = before
                out.results.append(Result(knob_id, value, before, before))
            else:
                left.append((knob_id, decision))
        return left

    def _inline(self, world: Knobs, wanted: Sequence[tuple[str, Decision]], back: Sequence[str],
                current: Mapping[str, KnobValue] | None, t_wall: float, out: Applied,
                force: frozenset[str] | set[str]) -> None:
        """Hand back ``back`` and write ``wanted`` (inline knobs) in the writer thread, under a deadline per
        knob (:mod:`aithermd.actuate.inline`); what is in place already is settled here, with no thread. A
        write given up on holds its device (``unanswered``) and the rest goes on at once in a new thread."""
        if wanted and current is not None:
            wanted = self._in_place(world, wanted, current, out, force, t_wall, fans=True)
        knobs = world.knobs
        while (wanted or back) and not self.closed:
            job, part = _Job([*back, *(k for k, _ in wanted)]), Applied()
            late = self.inline.run(self._batch, job, world, wanted, back, current, t_wall, job, part, force)
            self._merge(out, part)  # copied: a batch given up on adds nothing more to ``out``
            if late is None or job.stuck is None:
                return
            device = knobs[job.stuck].device_id
            out.events.append(self.unanswered.write_hung(device, job.stuck, self.inline.deadline_s, t_wall))
            self._track_hung(job.stuck, device, late)
            left, held = rest(job.knobs, job.stuck), self.unanswered.devices
            wanted = [item for item in wanted if item[0] in left and knobs[item[0]].device_id not in held]
            back = [k for k in back if k in left and knobs[k].device_id not in held]

    def _track_hung(self, knob_id: str, device: str, late: Any) -> None:
        """Track the write to ``knob_id`` given up on until it returns (then its device is written again)."""
        job = _Job((knob_id,))
        job.writing, job.hung = knob_id, device
        future = asyncio.wrap_future(late)

        def returned(f: asyncio.Future[Any]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved: a device fault was reported by the batch itself
            self.unanswered.returned(device)

        future.add_done_callback(returned)
        self._track(job, future)

    @staticmethod
    def _merge(out: Applied, part: Applied) -> None:
        out.events += part.events
        out.after.update(part.after)
        out.results += part.results

    def _batch(self, world: Knobs, wanted: Sequence[tuple[str, Decision]], back: Sequence[str],
               current: Mapping[str, KnobValue] | None, t_wall: float, job: _Job | None,
               out: Applied | None = None, force: frozenset[str] | set[str] = frozenset()) -> Applied:
        """Hand back, then write, one knob at a time (on the loop or in the worker thread), into ``out`` (a
        new :class:`Applied` by default); nothing once the executor is closed."""
        out = Applied() if out is None else out
        try:
            if back:
                self._hand_back(world, back, t_wall, job, out)
            self._write(world, wanted, current, t_wall, job, out, force)
        finally:
            if job is not None:
                job.writing = None
        return out

    def _hand_back(self, world: Knobs, back: Sequence[str], t_wall: float, job: _Job | None,
                   out: Applied) -> None:
        for knob_id in back:
            if self.closed or (job is not None and job.cut):
                return
            backend, knob = world.owner[knob_id], world.knobs[knob_id]
            if job is not None:
                job.writing, job.since = knob_id, time.monotonic()
            out.events += self.applier.give_back(backend, knob, t_wall)
            try:
                out.after[knob_id] = backend.read_knob(knob_id)
            except Exception:  # noqa: BLE001 - the next sample tells
                pass

    def _write(self, world: Knobs, wanted: Sequence[tuple[str, Decision]],
               current: Mapping[str, KnobValue] | None, t_wall: float, job: _Job | None,
               out: Applied, force: frozenset[str] | set[str] = frozenset()) -> None:
        for knob_id, decision in wanted:
            if self.closed or (job is not None and job.cut):
                return
            backend, knob = world.owner[knob_id], world.knobs[knob_id]
            if job is not None:
                job.writing, job.since = knob_id, time.monotonic()
            value = knob.clamp(float(decision.value))
            if current is not None:
                before = current.get(knob_id)
            else:
                try:
                    before = backend.read_knob(knob_id)
                except Exception:  # noqa: BLE001 - the applier writes anyway and reports
                    before = None
            after, events = self.applier.apply(backend, knob, knob.device_id, decision, value, before, t_wall,
                                               force=knob_id in force)
            if after is not None:
                out.after[knob_id] = after
            out.events += events
            out.results.append(Result(knob_id, value, before, after))

    # -- in flight -----------------------------------------------------------------------------------------
    def _track(self, job: _Job, future: asyncio.Future[Any]) -> None:
        job.future = future
        self._jobs.add(job)
        future.add_done_callback(lambda _: self._jobs.discard(job))

    @property
    def in_flight(self) -> frozenset[str]:
        """Knob ids of the jobs on the worker that have not returned yet."""
        return frozenset(k for job in self._jobs for k in job.knobs)

    async def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` s for every write in flight; True when none is left. An inline write given
        up on (its chip does not answer) is not waited for."""
        futures = {job.future for job in self._jobs if job.future is not None and job.hung is None}
        if futures:
            await asyncio.wait(futures, timeout=timeout_s)
        return not any(job.hung is None for job in self._jobs)

    async def close(self, timeout_s: float) -> frozenset[str]:
        """No write starts from now on; wait up to ``timeout_s`` s for those in flight. Returns the knobs
        whose write is still inside a backend call (abandoned: see the module doc)."""
        self.closed = True
        self.inline.close()
        self.applier.pause()  # a job between reading an original and writing stops there
        await self.settle(timeout_s)
        for job in list(self._jobs):
            if job.writing is not None:
                self._abandoned[job.writing] = job
        if self._abandoned:
            self._log.error("writes_abandoned", knobs=sorted(self._abandoned),
                            message="still inside a backend call at stop: restored last, journal kept")
        return frozenset(self._abandoned)

    def returned(self, knob_id: str) -> bool:
        """True when the abandoned write to ``knob_id`` has returned since (it can no longer land later)."""
        job = self._abandoned.get(knob_id)
        return job is None or job.future is None or job.future.done()

    async def wait_abandoned(self, timeout_s: float) -> frozenset[str]:
        """Wait up to ``timeout_s`` s for the abandoned writes (not those of a chip that does not answer);
        returns the knobs whose write returned."""
        futures = {job.future for job in self._abandoned.values()
                   if job.future is not None and job.hung is None}
        if futures:
            await asyncio.wait(futures, timeout=timeout_s)
        return frozenset(k for k in self._abandoned if self.returned(k))

    # -- the final restore ---------------------------------------------------------------------------------
    async def restore_all(self, backends: Sequence[Backend], timeout_s: float) -> RestoreReport:
        """The daemon's last act: :meth:`close` (waiting up to ``timeout_s`` s for the writes in flight),
        then every journaled knob restored from a fresh thread (the worker may be stuck in a hung call),
        abandoned ones last and kept journaled while their write may still land; then up to ``timeout_s``
        s more for those writes, each knob whose write returned restored again and forgotten. Returns the
        report: ``kept`` lists the knobs left journaled for ``aithermd restore`` (their write never
        returned, or a full-duty try of :mod:`~aithermd.actuate.rescue` has not). Raises JournalError when the
        journal cannot be written."""
        abandoned = await self.close(timeout_s)
        journal = self.applier.journal
        mute = {j.hung for k, j in self._abandoned.items() if j.hung is not None and not self.returned(k)}
        skipped = self.unanswered.split(journal.entries(), mute)
        only = [k for k in journal.entries() if k not in skipped] if skipped else None
        rescuing = frozenset(self.rescue.pending)  # a full-duty try still in the driver may land after it

        def keep(k: str) -> bool:
            return k in rescuing or (k in abandoned and not self.returned(k))

        report = await asyncio.to_thread(restore_journal, journal, backends=backends, last=abandoned,
                                         keep=keep, only=only)
        if skipped:  # its writes block: trying would hold the stop for ever (attack10 W1)
            self._log.error("restore_skipped", knobs=sorted(skipped), message="a write to their chip hung")
            report = replace(report, failed={**report.failed, **skipped})
        if abandoned:
            returned = await self.wait_abandoned(timeout_s)
            again = await asyncio.to_thread(restore_journal, journal, backends=backends, only=returned)
            still = tuple(k for k in report.kept if k not in again.restored)
            restored = (*report.restored, *(k for k in again.restored if k not in report.restored))
            report = replace(report, restored=restored, failed={**report.failed, **again.failed}, kept=still,
                             fallbacks={**report.fallbacks, **again.fallbacks})
            if still:
                self._log.error("restore_uncertain", knobs=list(still),
                                message="a write never returned: left journaled for 'aithermd restore'")
        for knob_id in report.restored:
            if knob_id not in report.kept:
                self.applier.forget(knob_id)
        return report
