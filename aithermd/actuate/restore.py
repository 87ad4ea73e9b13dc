"""Idempotent restore of every journaled knob, then the journal is cleared.

Used on SIGTERM/SIGINT (with the daemon's open backends), at start after a crash (the journal is dirty),
and by ``aithermd restore`` (``ExecStopPost=``), which needs nothing but the state directory: each entry's
locator rebuilds its backend through :func:`aithermd.backends.open_backend`. Restoring twice puts the same
values back twice. An entry whose restore fails stays in the journal (the report says why) so a later
restore can try again; the others are forgotten.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from aithermd.actuate.journal import Journal, JournalEntry
from aithermd.backends.base import Backend

Opener = Callable[[Mapping[str, Any]], Backend]


@dataclass(frozen=True)
class RestoreReport:
    """``restored``: knob ids put back; ``failed``: knob id → why (still journaled)."""

    restored: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def locator_key(locator: Mapping[str, Any]) -> str:
    """A locator as a canonical string, to match journal entries with open backends."""
    return json.dumps(dict(locator), sort_keys=True, default=str)


def _default_opener(locator: Mapping[str, Any]) -> Backend:
    """:func:`aithermd.backends.open_backend`, then discovery (knob ids are known only after it)."""
    from aithermd.backends import open_backend
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


def restore_journal(journal: Journal, *, backends: Iterable[Backend] = (), opener: Opener | None = None,
                    sysfs_root: Path | None = None) -> RestoreReport:
    """Restore every entry of ``journal``, newest first, and forget each one restored.

    ``backends``: already open backends, matched to entries by locator (the daemon's own); other locators
    are opened with ``opener`` (default :func:`aithermd.backends.open_backend`) and closed afterwards.
    ``sysfs_root`` replaces the ``sysfs_root`` of every locator that has one (``aithermd restore
    --sysfs-root``). Never raises for one knob's failure; raises JournalError when the journal cannot be
    written.
    """
    log = structlog.get_logger("aithermd.restore")
    opener = opener or _default_opener
    open_now: dict[str, Backend] = {locator_key(_relocate(b.locator(), sysfs_root)): b for b in backends}
    opened: list[Backend] = []
    failures: dict[str, str] = {}
    open_failures: dict[str, str] = {}
    restored: list[str] = []
    entries: list[JournalEntry] = list(journal.entries().values())
    try:
        for entry in reversed(entries):
            locator = _relocate(entry.locator, sysfs_root)
            key = locator_key(locator)
            backend = open_now.get(key)
            if backend is None and key not in open_failures:
                try:
                    backend = opener(locator)
                except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the rest
                    open_failures[key] = f"cannot open backend {locator}: {exc}"
                    backend = None
                else:
                    open_now[key] = backend
                    opened.append(backend)
            if backend is None:
                why = open_failures[key]
                failures[entry.knob_id] = why
                _say(log.error, "restore_failed", knob=entry.knob_id, device=entry.device_id, error=why)
                continue
            try:
                backend.restore_knob(entry.knob_id, dict(entry.saved))
            except Exception as exc:  # noqa: BLE001
                failures[entry.knob_id] = f"{type(exc).__name__}: {exc}"
                _say(log.error, "restore_failed", knob=entry.knob_id, device=entry.device_id,
                     error=failures[entry.knob_id])
                continue
            restored.append(entry.knob_id)
            _say(log.info, "restored", knob=entry.knob_id, device=entry.device_id, saved=dict(entry.saved))
    finally:
        for backend in opened:
            try:
                backend.close()
            except Exception:  # noqa: BLE001
                _say(log.warning, "backend_close_failed", backend=getattr(backend, "kind", "?"))
    if failures:
        for knob_id in restored:
            journal.forget(knob_id)
    else:
        journal.clear()
    return RestoreReport(tuple(restored), failures)


def restore_one(journal: Journal, backend: Backend, knob_id: str) -> None:
    """Put one journaled knob back (hand it back: no decision owns it any more) and forget it.
    Raises BackendError (the entry stays) or KeyError when ``knob_id`` is not journaled."""
    entry = journal.entries()[knob_id]
    backend.restore_knob(knob_id, dict(entry.saved))
    journal.forget(knob_id)
