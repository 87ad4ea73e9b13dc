"""The restore's per-device threads: one knob whose write never returns cannot keep any other device's knobs
from being put back (attack10 W3).

A driver stuck on its lock (nct6775 on a hung SMBus/ISA access, an EC, a USB fan hub behind a wedged
transfer, a GPU whose RM lock hangs) blocks a write to its attributes, in uninterruptible sleep, for ever.
The journal's entries are grouped by device (their backend's locator and ``device_id``): the knobs of one
chip share its driver's lock, and their order may matter (a cpufreq governor before its EPP), so a device's
knobs are restored one after another, newest entry first as the restore always went, in a thread of its own;
every device's thread starts at once. A device whose knobs are not all restored :data:`RESTORE_DEADLINE_S` s
after the first one began is given up: the knob whose restore did not return is *hung* and stays journaled
for a later ``aithermd restore``. The knobs after it get a thread of their own once more, with the same
deadline (a hang may be one attribute's; when the whole chip hangs they fail as hung in turn, or as not
tried). A backend opened for the restore (``aithermd restore`` discovers each one) has
:data:`OPEN_DEADLINE_S` s to open. Nothing a given-up thread does after its deadline counts (a knob it
finishes late stays journaled; putting it back again is harmless), and it stops after the knob it is in.

A hung thread is left behind, but it is *not* a daemon thread: the process exits once the knob it is in is
done. The process cannot exit earlier anyway (the kernel finishes an exit only when a thread blocked in a
driver, in uninterruptible sleep, comes back), and a daemon thread is killed by that exit the moment its
write returns, between the knob's two writes: an automatic original's duty lands, its mode is never written,
and the fan is left manual at that duty (``pwm5`` manual at 0 in the attack10 W3 reproduction, where it had
been at full duty). Its driver's lock held for ever, the process stays (it would in any case); a wait the
kernel can interrupt ends with systemd's SIGKILL.

Time: one restore takes at most :data:`OPEN_DEADLINE_S` + 2 × :data:`RESTORE_DEADLINE_S` (20 s) when backends
are opened (``aithermd restore``, ``ExecStopPost=``), and 2 × :data:`RESTORE_DEADLINE_S` (8 s) with the
daemon's own (each of its two exit restores, :meth:`aithermd.actuate.execute.Executor.restore_all`, which
also waits up to 5 s twice for writes in flight): within the unit's ``TimeoutStopSec=30s``
(systemd/aithermd.service) either way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.actuate.journal import JournalEntry
from aithermd.backends.base import Backend
from aithermd.errors import DeviceLost, RefusedOriginal, UnknownKnob

RESTORE_DEADLINE_S = 4.0  # s a device's knobs may take to restore (every device at once), then it is given up
OPEN_DEADLINE_S = 12.0  # s a backend may take to open (discovery; nvmlInit attaching every GPU: ~1 s each)
POLL_S = 0.01  # s between looks at the device threads
THREAD_NAME = "aithermd-restore"

Opener = Callable[[Mapping[str, Any]], Backend]
Say = Callable[..., None]  # say(level, event, **fields): logs, never raises
Restore = Callable[[JournalEntry, Mapping[str, Any], str, "Backend | str"], "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """One knob's restore: ``how`` is "restored", "failed" or "absent"; ``why`` the reason (or the
    backend's note for a restored knob left safe instead of as found); ``kept``: restored, but a write to it
    may still land (the entry stays)."""

    knob_id: str
    how: str
    why: str | None = None
    kept: bool = False


class Backends:
    """The backends of one restore, shared by its device threads: ``open_now`` (locator key → the daemon's
    open backends), others opened with ``opener`` on first use, once per locator (under that locator's
    lock, so an opening that hangs holds up only the devices behind that locator)."""

    def __init__(self, open_now: Mapping[str, Backend], opener: Opener) -> None:
        self.by_key: dict[str, Backend] = dict(open_now)
        self.opener = opener
        self.opened: dict[int, tuple[str, Backend]] = {}  # id → (locator key, backend opened here)
        self.failed: dict[str, str] = {}  # locator key → why it cannot be opened
        self.reopened: set[str] = set()  # keys opened afresh after the daemon's backend lost a device
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    def _open(self, key: str, locator: Mapping[str, Any]) -> Backend:
        backend = self.opener(locator)
        self.by_key[key] = backend
        self.opened[id(backend)] = (key, backend)
        return backend

    def get(self, key: str, locator: Mapping[str, Any]) -> Backend | str:
        """The backend for ``locator``, or why it cannot be opened."""
        with self._key_lock(key):
            if key in self.by_key:
                return self.by_key[key]
            if key not in self.failed:
                try:
                    return self._open(key, locator)
                except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the rest
                    self.failed[key] = f"cannot open backend {dict(locator)}: {exc}"
            return self.failed[key]

    def reopen(self, key: str, locator: Mapping[str, Any], lost: Backend) -> Backend | None:
        """After ``lost`` (the daemon's backend) raised DeviceLost for a sysfs device: a backend opened afresh
        for its locator (a driver reload may have moved the chip; discovery finds it by its id, as
        ``aithermd restore`` would), once per locator; None when there is none to try (the one that failed
        was opened afresh already, or the locator has no sysfs root: a GPU lost to NVML is looked up by UUID
        within its backend already). Raises what the opener raises."""
        with self._key_lock(key):
            now = self.by_key.get(key)
            if now is not None and now is not lost and key in self.reopened:
                return now  # another device of this locator opened it afresh already
            if id(lost) in self.opened or key in self.reopened or "sysfs_root" not in locator:
                return None
            self.reopened.add(key)
            return self._open(key, locator)


class Device:
    """One device's entries (in restore order), restored by :meth:`run` in a thread of its own (not a
    daemon thread: see the module doc). ``retry``: whether the entries after a
    hung one get a thread of their own once more (:func:`restore_devices`)."""

    def __init__(self, key: str, locator: Mapping[str, Any], backends: Backends, restore: Restore,
                 entries: list[JournalEntry], retry: bool = True) -> None:
        self.key, self.locator, self.backends, self.restore = key, locator, backends, restore
        self.entries, self.retry = entries, retry
        self.done: list[Outcome] = []
        self.current: str | None = None  # the knob whose restore is under way, "" while getting its backend
        self.opening: float | None = None  # when it began to get its backend (monotonic s)
        self.restoring: float | None = None  # when its first knob's restore began (monotonic s)
        self.given_up = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name=THREAD_NAME, daemon=False)

    def run(self) -> None:
        try:
            for entry in self.entries:
                if not self._begin(""):
                    return
                backend = self.backends.get(self.key, self.locator)
                if not self._begin(entry.knob_id):
                    return
                outcome = self.restore(entry, self.locator, self.key, backend)
                with self.lock:
                    if self.given_up:  # too late: it does not count (the entry stays journaled)
                        return
                    self.done.append(outcome)
                    self.current = None
        except BaseException:  # noqa: BLE001 - never raised by restore_entry; the rest stays journaled
            return

    def _begin(self, what: str) -> bool:
        with self.lock:
            if self.given_up:
                return False
            self.current = what
            now = time.monotonic()
            if what == "" and self.opening is None:
                self.opening = now
            if what != "" and self.restoring is None:
                self.restoring = now
            return True

    def overdue(self, now: float, deadline_s: float, open_deadline_s: float) -> bool:
        """Whether it took too long: its backend not at hand ``open_deadline_s`` s after it asked for it, or
        its knobs not restored ``deadline_s`` s after the first one began."""
        with self.lock:
            if self.restoring is not None:
                return now - self.restoring > deadline_s
            return self.opening is not None and now - self.opening > open_deadline_s

    def give_up(self, deadline_s: float) -> tuple[list[Outcome], JournalEntry | None, str,
                                                  list[JournalEntry]]:
        """Stop counting its thread's work: what it did, the entry it hung on (None when it did not get
        that far), why, and the entries not tried."""
        with self.lock:
            self.given_up = True
            left, current, done = self.entries[len(self.done):], self.current, list(self.done)
        if not left:
            return done, None, "", []
        if current == "":
            why = f"its backend {dict(self.locator)} did not open in time (a driver that does not answer?)"
            return done, None, why, left
        why = (f"hung: its restore did not return within {deadline_s:g} s (a driver stuck in the write?); "
               f"{KEEP}")
        return done, left[0], why, left[1:]


KEEP = "left journaled for a later 'aithermd restore'"


def restore_entry(entry: JournalEntry, locator: Mapping[str, Any], key: str, backend: Backend | str,
                  backends: Backends, absence: Callable[[Mapping[str, Any]], bool],
                  keep: Callable[[str], bool] | None, say: Say) -> Outcome:
    """Restore one entry on ``backend`` (or fail with the string: why it cannot be opened), logging what
    happened; never raises."""
    if isinstance(backend, str):
        say("error", "restore_failed", knob=entry.knob_id, device=entry.device_id, error=backend)
        return Outcome(entry.knob_id, "failed", backend)
    again = keep is not None and keep(entry.knob_id)  # asked before: a write may land during ours
    try:
        try:
            note = backend.restore_knob(entry.knob_id, dict(entry.saved))
        except DeviceLost:
            fresh = backends.reopen(key, locator, backend)
            if fresh is None:
                raise
            note = fresh.restore_knob(entry.knob_id, dict(entry.saved))
    except Exception as exc:  # noqa: BLE001
        why = str(exc) if isinstance(exc, RefusedOriginal) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, UnknownKnob) and absence(locator):
            why = f"{entry.device_id} not found: kept until it is back or the machine reboots"
            say("warning", "restore_absent", knob=entry.knob_id, device=entry.device_id, message=why)
            return Outcome(entry.knob_id, "absent", why)
        say("error", "restore_failed", knob=entry.knob_id, device=entry.device_id, error=why)
        return Outcome(entry.knob_id, "failed", why)
    where = {"knob": entry.knob_id, "device": entry.device_id}
    if isinstance(note, str):
        say("warning", "restore_fallback", **where, message=note)
    else:
        say("info", "restored", **where, saved=dict(entry.saved))
    return Outcome(entry.knob_id, "restored", note if isinstance(note, str) else None, kept=again)


def restore_devices(plan: Iterable[tuple[str, Mapping[str, Any], JournalEntry]], backends: Backends,
                    absence: Callable[[Mapping[str, Any]], bool], keep: Callable[[str], bool] | None,
                    say: Say, deadline_s: float | None = None,
                    open_deadline_s: float | None = None) -> tuple[list[Outcome], set[str]]:
    """Restore ``plan`` (locator key, locator, entry; in restore order) one device per thread, every thread
    at once. A device whose knobs are not all restored ``deadline_s`` s (default :data:`RESTORE_DEADLINE_S`)
    after its first began, or whose backend is not at hand ``open_deadline_s`` s (default
    :data:`OPEN_DEADLINE_S`) after it asked, is given up: its knob under way fails as hung, and the knobs
    after it get one more thread, once (a hang may be one attribute's, a USB hub's channel; a chip that hangs
    whole fails them as hung in turn, or as not tried). Returns every entry's outcome (hung ones
    ``failed`` with a reason that starts "hung:", each logged ``restore_failed`` with ``hung=True``) and the
    locator keys of the devices given up (an abandoned thread may still be inside their backend: not to be
    closed)."""
    deadline_s = RESTORE_DEADLINE_S if deadline_s is None else deadline_s
    open_deadline_s = OPEN_DEADLINE_S if open_deadline_s is None else open_deadline_s

    def restore(entry: JournalEntry, locator: Mapping[str, Any], key: str, backend: Backend | str) -> Outcome:
        return restore_entry(entry, locator, key, backend, backends, absence, keep, say)

    groups: dict[tuple[str, str], list[JournalEntry]] = {}
    where: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for key, locator, entry in plan:
        groups.setdefault((key, entry.device_id), []).append(entry)
        where[key] = (key, locator)
    active = [Device(key, where[key][1], backends, restore, entries) for (key, _), entries in groups.items()]
    for device in active:
        device.thread.start()
    outcomes: list[Outcome] = []
    hung: set[str] = set()
    while active:
        now = time.monotonic()
        for device in list(active):
            if not device.thread.is_alive():
                outcomes.extend(device.done)
                active.remove(device)
                continue
            if not device.overdue(now, deadline_s, open_deadline_s):
                continue
            active.remove(device)
            done, stuck, why, rest = device.give_up(deadline_s)
            outcomes.extend(done)
            failed = [(stuck, why)] if stuck is not None else []
            if stuck is not None and rest and device.retry:
                again = Device(device.key, device.locator, backends, restore, rest, retry=False)
                active.append(again)
                again.thread.start()
            elif stuck is not None:
                failed += [(e, f"not tried: {e.device_id} hung on {stuck.knob_id}; {KEEP}") for e in rest]
            else:
                failed += [(e, f"hung: {why}; {KEEP}") for e in rest]
            for entry, reason in failed:
                hung.add(device.key)
                outcomes.append(Outcome(entry.knob_id, "failed", reason))
                say("error", "restore_failed", knob=entry.knob_id, device=entry.device_id, hung=True,
                    error=reason)
        if active:
            time.sleep(POLL_S)
    return outcomes, hung
