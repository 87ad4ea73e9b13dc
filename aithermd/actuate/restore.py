"""Idempotent restore of every journaled knob, then the journal is cleared.

Used on SIGTERM/SIGINT (with the daemon's open backends), at start after a crash (the journal is dirty),
and by ``aithermd restore`` (``ExecStopPost=``), which needs nothing but the state directory: each entry's
locator rebuilds its backend through :func:`aithermd.backends.registry.open_backend`. Restoring twice puts
the same values back twice. An entry whose restore fails stays in the journal (the report says why) so a later
restore can try again; the others are forgotten.

Each device is restored in a thread of its own, all at once, under a deadline
(:mod:`aithermd.actuate.restore_devices`, :data:`~aithermd.actuate.restore_devices.RESTORE_DEADLINE_S`): a
knob whose write never returns (a driver stuck on its lock) fails as hung and stays journaled with the
knobs of its device not tried after it, and every other device is restored all the same (attack10 W3).

A knob whose device is gone would otherwise fail every restore (and every daemon stop) forever. When the
entry's backend opens on a real root (a sysfs root must hold a ``class`` directory: a wrong ``--sysfs-root``
proves nothing) and answers :class:`~aithermd.errors.UnknownKnob`, the knob is *absent*: there is nothing to
put back now, so it is not a failure. An absent entry stays journaled while its device may come back in this
boot (a module loaded late, a GPU lost and reset: its original still applies then) and is reported
(``RestoreReport.absent``). Every entry recorded in an earlier boot (proved: :mod:`aithermd.actuate.boot`),
its device present or not, is forgotten with a warning and nothing written (``RestoreReport.forgotten``): the
reboot re-initialised the device, and what its firmware or driver set since (a BIOS fan setting changed, a
limit set at boot) is the state found now (attack6 G11: a crash, a reboot, and the old boot's fan curve
came back over the new BIOS setting). A knob whose
device is there but whose write fails (a lost GPU, EIO, EACCES) and a backend that cannot be opened keep
their entries and fail the restore.

A sysfs knob the daemon's own open backend reports lost (:class:`~aithermd.errors.DeviceLost`: a driver
reload renumbered its hwmon chip, with no udev event to rediscover it) is tried once more through a backend
opened afresh for its locator: discovery finds the chip by its id, as ``aithermd restore`` does.

A restore that could not put the original back but left the knob safe instead (a fan at full duty, or in
its driver's automatic mode when the original mode could not be read: :mod:`aithermd.backends.pwm`) is
restored, with the backend's note in ``RestoreReport.fallbacks`` and a warning in the log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from aithermd.actuate.boot import Boot
from aithermd.actuate.journal import Journal, JournalEntry
from aithermd.actuate.locators import own_roots, refusal
from aithermd.actuate.restore_devices import Backends, restore_devices
from aithermd.backends.base import TO_WRITER, Backend
from aithermd.model import Knob

Opener = Callable[[Mapping[str, Any]], Backend]


@dataclass(frozen=True)
class RestoreReport:
    """``restored``: knob ids put back; ``failed``: knob id → why (still journaled); ``absent``: knob id →
    why, its device not there, still journaled (not a failure); ``forgotten``: knob id → why, journaled in
    an earlier boot, dropped with nothing written (not a failure); ``kept``: restored but still journaled (a
    write to them may still land); ``fallbacks``: knob id → what was done instead of the original
    (restored, but not as found: full duty, or the driver's automatic mode)."""

    restored: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    absent: Mapping[str, str] = field(default_factory=dict)
    forgotten: Mapping[str, str] = field(default_factory=dict)
    kept: tuple[str, ...] = ()
    fallbacks: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def locator_key(locator: Mapping[str, Any]) -> str:
    """A locator as a canonical string, to match journal entries with open backends."""
    return json.dumps(dict(locator), sort_keys=True, default=str)


def _default_opener(locator: Mapping[str, Any]) -> Backend:
    """:func:`aithermd.backends.registry.open_backend`, then discovery (knob ids are known only after it)."""
    from aithermd.backends.registry import open_backend
    backend = open_backend(dict(locator))
    backend.discover()
    return backend


def _say(method: Callable[..., Any], event: str, **fields: Any) -> None:
    """Log, but never let a failing log sink (EPIPE on a closed stderr) stop a restore."""
    try:
        method(event, **fields)
    except Exception:  # noqa: BLE001
        pass


def _relocate(locator: Mapping[str, Any], sysfs_root: Path | None) -> dict[str, Any]:
    out = dict(locator)
    if sysfs_root is not None and "sysfs_root" in out:
        out["sysfs_root"] = str(sysfs_root)
    return out


def _proves_absence(locator: Mapping[str, Any]) -> bool:
    """Whether an unknown knob on this locator's backend means its device is absent: not on a sysfs root
    that is no sysfs tree (no ``class`` directory), where every knob is unknown."""
    root = locator.get("sysfs_root")
    return root is None or os.path.isdir(os.path.join(str(root), "class"))


def restore_journal(journal: Journal, *, backends: Iterable[Backend] = (), opener: Opener | None = None,
                    sysfs_root: Path | None = None, boot_id: str | None = None, last: Collection[str] = (),
                    keep: Callable[[str], bool] | None = None, only: Collection[str] | None = None,
                    own_root: Path | None = None, deadline_s: float | None = None) -> RestoreReport:
    """Restore every entry of ``journal`` (or ``only`` those knob ids), newest first, and forget each one
    restored.

    ``backends``: already open backends, matched to entries by locator (the daemon's own); other locators
    are opened with ``opener`` (default :func:`aithermd.backends.registry.open_backend`) and closed
    afterwards.
    ``sysfs_root`` replaces the ``sysfs_root`` of every locator that has one (``aithermd restore
    --sysfs-root``). Without it, an entry is applied only under the daemon's own root (``backends``'
    roots and ``own_root``: the config's) or a root no one but root or this user can write, else refused and
    kept (:mod:`aithermd.actuate.locators`). An entry recorded in an earlier boot than this one
    (``boot_id``: this boot's id, default the kernel's; proved as :mod:`aithermd.actuate.boot` says) is
    forgotten, nothing written; a knob its backend does not know is absent, and kept (see the module doc).
    Each device's knobs are restored in that order in a thread of their own, every device at once, each
    within ``deadline_s`` s (default :data:`~aithermd.actuate.restore_devices.RESTORE_DEADLINE_S`); a device
    not done by then fails its unfinished knobs as hung (reason ``hung: ...``) or not tried, journaled still,
    and its thread is left behind to finish the knob it is in (the process exits after it: see
    :mod:`aithermd.actuate.restore_devices`). The knobs in ``last`` are restored after every other
    one of their device; a knob for which ``keep(knob_id)`` is true as
    its restore begins stays journaled once restored (``RestoreReport.kept``): a write to it may still land
    (the daemon's final restore, :mod:`aithermd.actuate.execute`).
    Never raises for one knob's failure; raises JournalError when the journal cannot be written.
    """
    log = structlog.get_logger("aithermd.restore")
    backends = tuple(backends)
    own = own_roots(backends, own_root)
    shared = Backends({locator_key(_relocate(b.locator(), sysfs_root)): b for b in backends},
                      opener or _default_opener)
    failures: dict[str, str] = {}
    boot = Boot.now(boot_id)
    unsure: list[str] = []
    forgotten: dict[str, str] = {}
    newest: list[JournalEntry] = [e for e in list(journal.entries().values())[::-1]
                                  if only is None or e.knob_id in only]
    plan: list[tuple[str, dict[str, Any], JournalEntry]] = []
    for entry in [e for e in newest if e.knob_id not in last] + [e for e in newest if e.knob_id in last]:
        if boot.earlier(entry):
            forgotten[entry.knob_id] = (f"{entry.device_id} was journaled in an earlier boot: the reboot "
                                        "re-initialised it, and what its firmware or driver set now "
                                        "stands; entry forgotten, nothing written")
            _say(log.warning, "restore_forgotten", knob=entry.knob_id, device=entry.device_id,
                 message=forgotten[entry.knob_id])
            continue
        if boot.unsure(entry):
            unsure.append(entry.knob_id)
        locator = _relocate(entry.locator, sysfs_root)
        key = locator_key(locator)
        refused = None if key in shared.by_key or sysfs_root is not None else refusal(locator, own)
        if refused is not None:
            failures[entry.knob_id] = refused
            _say(log.error, "restore_refused", knob=entry.knob_id, device=entry.device_id, error=refused)
            continue
        plan.append((key, locator, entry))
    hung: set[str] = set()
    try:
        outcomes, hung = restore_devices(plan, shared, _proves_absence, keep,
                                         lambda level, event, **kw: _say(getattr(log, level), event, **kw),
                                         deadline_s)
    finally:
        for key, backend in list(shared.opened.values()):
            if key in hung:
                continue  # an abandoned thread may still be inside it
            try:
                backend.close()
            except Exception:  # noqa: BLE001
                _say(log.warning, "backend_close_failed", backend=getattr(backend, "kind", "?"))
    restored = [o.knob_id for o in outcomes if o.how == "restored"]
    failures.update({o.knob_id: o.why or "" for o in outcomes if o.how == "failed"})
    absent = {o.knob_id: o.why or "" for o in outcomes if o.how == "absent"}
    kept = [o.knob_id for o in outcomes if o.how == "restored" and o.kept]
    fallbacks = {o.knob_id: o.why for o in outcomes if o.how == "restored" and o.why is not None}
    if unsure:
        _say(log.warning, "restore_boot_unknown", knobs=unsure,
             message=("the kernel's boot id cannot be read (or was not when they were journaled) and their "
                      "uptime proves no reboot: put back as this boot's originals"))
    if failures or absent or kept or only is not None:
        for knob_id in [*(k for k in restored if k not in kept), *forgotten]:
            journal.forget(knob_id)
    else:
        journal.clear()
    return RestoreReport(tuple(restored), failures, absent, forgotten, tuple(kept), fallbacks)


def restore_one(journal: Journal, backend: Backend, knob_id: str, to_writer: bool = False) -> str | None:
    """Put one journaled knob back (hand it back: no decision owns it any more) and forget it; ``to_writer``:
    to another program that keeps writing it (a fan's manual mode is then put back at any duty:
    :data:`aithermd.backends.base.TO_WRITER`). Returns the backend's note when it left the knob
    safe instead of as found (full duty). Raises BackendError (the entry stays) or KeyError when ``knob_id``
    is not journaled."""
    entry = journal.entries()[knob_id]
    note = backend.restore_knob(knob_id, {**entry.saved, TO_WRITER: True} if to_writer else dict(entry.saved))
    journal.forget(knob_id)
    return note if isinstance(note, str) else None


def make_fans_safe(owner: Mapping[str, Backend], knobs: Iterable[Knob]) -> dict[str, str]:
    """After the originals were lost (:attr:`~aithermd.actuate.journal.Journal.lost`): every fan, GPU power
    limit and SM clock lock put right (:func:`aithermd.actuate.lost.make_safe`: a fan at a low manual duty
    to its driver's automatic mode, a GPU limit below its default to the default, a clock lock reset).
    Returns knob id → what was done, or why it failed. Never raises for one knob."""
    from aithermd.actuate.lost import make_safe
    return make_safe(owner, knobs)


def restore_at_start(journal: Journal, owner: Mapping[str, Backend], knobs: Iterable[Knob],
                     backends: Iterable[Backend], dry_run: bool) -> None:
    """The daemon's start, before the first tick: a journal left by a crash is restored with the daemon's
    ``backends``; a journal moved aside (:attr:`~aithermd.actuate.journal.Journal.lost`) makes the fans safe
    (:func:`make_fans_safe`, over ``knobs`` and their ``owner``). A dry run writes nothing. Logs; never
    raises for one knob."""
    log = structlog.get_logger("aithermd.daemon")
    if journal.lost is not None:  # the originals are lost: fans, GPU limits and clock locks made safe
        _say(log.error, "journal_unreadable", error=journal.lost)
        if not dry_run:
            make_fans_safe(owner, knobs)
    if not journal.dirty:
        return
    if dry_run:
        _say(log.warning, "journal_dirty", knobs=list(journal.entries()),
             message="left for a real run or 'aithermd restore' (dry-run writes nothing)")
        return
    _say(log.warning, "journal_dirty", knobs=list(journal.entries()), message="restoring after a crash")
    report = restore_journal(journal, backends=backends)
    if not report.ok:
        _say(log.error, "restore_incomplete", failed=dict(report.failed))
