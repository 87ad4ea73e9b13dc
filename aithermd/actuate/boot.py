"""Whether a journal entry was recorded in an earlier boot (attack6 G11), safe both ways (attack7 H8).

An entry of an earlier boot is forgotten, nothing written: the reboot re-initialised its device, and what its
firmware set since stands. An entry of *this* boot must never be forgotten: its original would be lost and the
knob left at the crashed daemon's last value. So an entry is forgotten only when a reboot is *proved*:

- both boot ids known (``/proc/sys/kernel/random/boot_id``, a new UUID at every boot) and different; or
- the kernel's uptime now (``CLOCK_BOOTTIME``: monotonic within a boot, suspend included, reset only by a
  boot) is below the uptime the entry was recorded at: a boot came between. No wall clock is trusted (a
  clock stepped by NTP after a dead RTC proves nothing).

Otherwise (a boot id unreadable — a container or sandbox masking ``/proc/sys`` — and no uptime to prove a
reboot, as in a journal written before entries carried it) the entry is put back, with one warning that the
boot could not be told (:meth:`Boot.unsure`): an old boot's original is at worst the value its device had
before that crash, which the restore's rules still keep safe (a fan at a low manual duty goes to automatic).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class Recorded(Protocol):
    boot_id: str
    uptime_s: float | None


def current_boot_id(path: str | None = None) -> str:
    """The kernel's random boot id (a new UUID at every boot, proc(5); ``path`` default
    :data:`BOOT_ID_PATH`), or "" when it cannot be read (or is empty)."""
    try:
        with open(path or BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def uptime_s() -> float:
    """Seconds since this boot (``CLOCK_BOOTTIME``, suspend included)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Boot:
    """This boot as a restore sees it: ``id`` the kernel's boot id ("" when unreadable), ``uptime_s`` its
    ``CLOCK_BOOTTIME`` in seconds."""

    id: str
    uptime_s: float

    @classmethod
    def now(cls, boot_id: str | None = None, path: str | None = None) -> Boot:
        """This boot; ``boot_id`` overrides the one read from ``path`` (:func:`current_boot_id`)."""
        return cls(current_boot_id(path) if boot_id is None else boot_id, uptime_s())

    def earlier(self, entry: Recorded) -> bool:
        """True when ``entry`` was recorded in an earlier boot, proved (see the module doc)."""
        if entry.boot_id and self.id:
            return entry.boot_id != self.id
        return entry.uptime_s is not None and self.uptime_s < entry.uptime_s

    def unsure(self, entry: Recorded) -> bool:
        """True when ``entry`` is put back without knowing whether the machine rebooted since."""
        return not (entry.boot_id and self.id) and not self.earlier(entry)
