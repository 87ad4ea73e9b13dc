"""The crash-safe journal of every knob's original state, kept in the state directory.

Before the first write to a knob, its original raw state (``Backend.save_knob``: value and mode in the
hardware's units) and the locator of the backend that owns it (``Backend.locator()``: backend kind and
root, e.g. ``{"backend": "hwmon", "sysfs_root": ROOT}``, or the fake NVML's state file) are written to
``<state_dir>/journal.json`` atomically: a temporary file in the same directory, fsync, rename over the
old file, fsync of the directory. A crash at any instant leaves either the old or the new journal, never a
torn one, and a knob is never written before its original is on disk.

An entry already present is never overwritten: after a crash whose restore failed, the entry still holds
the state found before the first daemon touched the knob. The file exists only while it holds entries
("dirty"); :meth:`Journal.clear` removes it.

A journal that cannot be decoded (a filesystem repaired after a power cut, a restored backup, an editor:
attack6 G1) cannot say what any knob was. Opened with ``quarantine=True`` (the daemon, ``aithermd
restore``) it is moved aside to ``journal.json.corrupt-<unix time>`` for a person to read, the journal
starts empty and :attr:`Journal.lost` says so; the caller then hands every fan found in manual mode at a
low duty to its driver's automatic mode and every GPU power limit below its default to the default
(:func:`aithermd.actuate.lost.make_safe`), since nothing else would put them right. Without it (tools that
only read) it raises :class:`JournalError`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aithermd.actuate.boot import current_boot_id, uptime_s
from aithermd.errors import AithermError
from aithermd.files import read_state_file, trusted_state_dir

JOURNAL_FILE = "journal.json"
FORMAT_VERSION = 1


class JournalError(AithermError):
    """The journal cannot be read (not JSON, wrong shape) or written (disk full, read-only state dir)."""


class _Undecodable(ValueError):
    """The journal's bytes were read but are no journal."""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One knob's original state: ``saved`` as ``Backend.save_knob`` returned it, ``locator`` as
    ``Backend.locator()`` returned it, ``device_id`` for reports, ``recorded_wall`` in Unix seconds,
    ``boot_id`` the kernel's boot id when it was recorded ("" when unknown), ``uptime_s`` the kernel's
    uptime then (``CLOCK_BOOTTIME``, s; None in journals older than it): :mod:`aithermd.actuate.boot`."""

    knob_id: str
    device_id: str
    locator: Mapping[str, Any]
    saved: Mapping[str, Any]
    recorded_wall: float
    boot_id: str = ""
    uptime_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"knob_id": self.knob_id, "device_id": self.device_id, "locator": dict(self.locator),
                "saved": dict(self.saved), "recorded_wall": self.recorded_wall, "boot_id": self.boot_id,
                "uptime_s": self.uptime_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JournalEntry:
        return cls(knob_id=str(data["knob_id"]), device_id=str(data.get("device_id", "")),
                   locator=dict(data["locator"]), saved=dict(data["saved"]),
                   recorded_wall=float(data.get("recorded_wall", 0.0)), boot_id=str(data.get("boot_id", "")),
                   uptime_s=None if data.get("uptime_s") is None else float(data["uptime_s"]))


def read_journal(state_dir: Path, path: Path) -> bytes:
    """The journal's bytes, read only from a state directory and file this process may trust (its own
    uid's or root's, writable by nobody else; the file not a symlink: :mod:`aithermd.files`): root must
    not restore a journal planted by a user into whatever its locator names. Raises FileNotFoundError (no
    journal), UntrustedStateFile (refused, contents unread), OSError."""
    if state_dir.is_dir():
        trusted_state_dir(state_dir)
    return read_state_file(path)


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content: temp file in the
    same directory, fsync, rename, fsync of the directory (POSIX rename(2) is atomic within a filesystem).
    Creates the directory (0700) when missing. Raises OSError."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename or unlink in it is durable."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Journal:
    """The journal of one state directory. Not thread-safe: one writer at a time (the control loop, or
    ``aithermd restore`` while no daemon runs)."""

    def __init__(self, state_dir: Path, quarantine: bool = False) -> None:
        """Raises JournalError when the file cannot be read, or cannot be decoded and ``quarantine`` is
        false (or the move aside fails)."""
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / JOURNAL_FILE
        self.lost: str | None = None  # why the originals are lost (a journal moved aside), else None
        try:
            self._entries: dict[str, JournalEntry] = self._load()
        except _Undecodable as exc:
            if not quarantine:
                raise JournalError(f"{exc}; 'aithermd restore' moves it aside and hands every fan left in "
                                   "manual mode at a low duty to its driver's automatic mode") from None
            self._entries = {}
            self.lost = self._move_aside(str(exc))

    def _move_aside(self, why: str) -> str:
        """Rename the journal to a name no earlier one took (attack7 H5: two in one second overwrote the
        first); when it cannot be moved (a file system remounted read-only after the error that tore it:
        attack7 H4) it stays, and the fans are made safe all the same."""
        stamp = int(time.time())
        aside = next(p for n in range(1, 1000) if not (p := self.path.with_name(
            f"{JOURNAL_FILE}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))).exists())
        try:
            os.link(self.path, aside)  # never over an existing file
            os.unlink(self.path)
            fsync_dir(self.state_dir)
            where = f"moved to {aside.name}"
        except OSError as exc:
            where = f"it cannot be moved aside ({exc.strerror or exc}) and stays"
        return (f"{why}: {where}; the originals it held are lost, so every fan found in manual mode at a low "
                "duty goes to its driver's automatic mode, and every GPU power limit found below its "
                "default goes to the default (aithermd.actuate.lost)")

    def _load(self) -> dict[str, JournalEntry]:
        self._remove_leftovers()
        try:
            raw = read_journal(self.state_dir, self.path)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot read the journal: {exc.strerror or exc}") from exc
        try:
            doc = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError too
            raise _Undecodable(f"{self.path}: not a journal (not JSON: {exc})") from exc
        entries = doc.get("entries") if isinstance(doc, dict) else None
        keys = ("knob_id", "locator", "saved")
        problem = "not a JSON object with a list of 'entries'" if not isinstance(entries, list) else next(
            (f"entry {i} is not an object with {', '.join(keys)}" for i, e in enumerate(entries)
             if not isinstance(e, dict) or not all(k in e for k in keys)), None)
        try:
            if problem is None:
                return {e["knob_id"]: JournalEntry.from_json(e) for e in entries}
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"an entry does not decode: {exc}"  # a locator or saved state of the wrong shape
        raise _Undecodable(f"{self.path}: not a journal ({problem})")

    def _remove_leftovers(self) -> None:
        if not self.state_dir.is_dir():
            return
        for tmp in self.state_dir.glob(f".{JOURNAL_FILE}.*.tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass

    @property
    def dirty(self) -> bool:
        """True when knobs are journaled (their originals must be restored)."""
        return bool(self._entries)

    def entries(self) -> Mapping[str, JournalEntry]:
        """knob id → entry, in the order they were recorded."""
        return MappingProxyType(self._entries)

    def __contains__(self, knob_id: object) -> bool:
        return knob_id in self._entries

    def record(self, knob_id: str, device_id: str, locator: Mapping[str, Any], saved: Mapping[str, Any],
               wall: float, boot_id: str | None = None) -> bool:
        """Journal ``knob_id``'s original state unless it is journaled already; returns True when written.
        ``boot_id`` defaults to :func:`current_boot_id`; the uptime is recorded too. The entry is on disk
        when this returns. Raises
        JournalError (nothing may then be written)."""
        if knob_id in self._entries:
            return False
        boot = current_boot_id() if boot_id is None else boot_id
        entry = JournalEntry(knob_id, device_id, dict(locator), dict(saved), wall, boot, uptime_s())
        entries = {**self._entries, knob_id: entry}
        self._save(entries)
        self._entries = entries
        return True

    def hold(self, knob_id: str, device_id: str, locator: Mapping[str, Any], saved: Mapping[str, Any],
             wall: float, boot_id: str | None = None) -> None:
        """Keep ``knob_id``'s original in memory only, when :meth:`record` cannot write it (disk full) and a
        safety decision must be written anyway: a clean stop still puts it back; the next write of the
        journal that succeeds puts it on disk too."""
        if knob_id not in self._entries:
            boot = current_boot_id() if boot_id is None else boot_id
            self._entries = {**self._entries,
                             knob_id: JournalEntry(knob_id, device_id, dict(locator), dict(saved), wall, boot,
                                                   uptime_s())}

    def forget(self, knob_id: str) -> None:
        """Drop one entry (its knob was restored or handed to another program)."""
        if knob_id not in self._entries:
            return
        entries = {k: v for k, v in self._entries.items() if k != knob_id}
        self._save(entries)
        self._entries = entries

    def clear(self) -> None:
        """Remove every entry (the journal file goes away)."""
        self._save({})
        self._entries = {}

    def _save(self, entries: Mapping[str, JournalEntry]) -> None:
        try:
            if not entries:
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    return
                fsync_dir(self.state_dir)
                return
            doc = {"version": FORMAT_VERSION, "entries": [e.to_json() for e in entries.values()]}
            write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot write the journal: {exc.strerror or exc}") from exc
