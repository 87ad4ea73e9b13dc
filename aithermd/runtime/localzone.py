"""The machine's own time zone followed while the daemon runs (policies with ``timezone: local``).

The C library reads the zone once (``/etc/localtime`` when ``TZ`` is not set) and ``localtime()`` never
looks again: after ``timedatectl set-timezone`` a running daemon kept the old zone, so a fresh install
running in UTC kept ``workstation``'s quiet hours 8 h off until a restart (attack8 T5). systemd-timedated
replaces ``/etc/localtime`` (a new symlink: another inode, target and mtime), so :class:`LocalZone` looks at
it once a minute — one ``lstat`` — and calls :func:`time.tzset` when it changed. Zones named in a policy
(``timezone: Europe/Berlin``) go through :mod:`zoneinfo` and need none of this.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

CHECK_S = 60.0  # s between looks at the zone file: a quiet-hours boundary is a minute
DEFAULT_PATH = "/etc/localtime"


def zone_path() -> str | None:
    """The file the C library reads the local zone from, ``/etc/localtime``; None when ``TZ`` is set: it
    pins the zone (``timedatectl`` does not change it), and glibc's ``tzset`` reads a file again only when
    the ``TZ`` string itself changed (time/tzset.c)."""
    return None if os.environ.get("TZ") is not None else DEFAULT_PATH


def _stamp(path: str) -> tuple[int, int, int, str] | None:
    """(inode, mtime ns, size, symlink target) of ``path`` itself (not followed), None when absent."""
    try:
        st = os.lstat(path)
        target = os.readlink(path) if os.path.islink(path) else ""
        if target:  # a symlink replaced by one to another zone: the target file's stamp moves too
            st2 = os.stat(path)
            return st.st_ino, st2.st_mtime_ns, st2.st_size, target
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size, ""


class LocalZone:
    """Calls ``tzset`` (default :func:`time.tzset`) at most once per :data:`CHECK_S` of monotonic time,
    when the zone file (``path``, default :func:`zone_path`; None: nothing to follow) changed since the
    last look."""

    def __init__(self, path: str | None = None, tzset: Callable[[], None] = time.tzset) -> None:
        self.path = path if path is not None else zone_path()
        self.tzset = tzset
        self._stamp = _stamp(self.path) if self.path is not None else None
        self.due = 0.0 if self.path is not None else math.inf  # monotonic s of the next look

    def check(self, t_mono: float) -> bool:
        """Look at the zone file if :data:`CHECK_S` passed since the last look (``t_mono``: monotonic s);
        True when the zone was read again."""
        if t_mono < self.due:
            return False
        self.due = t_mono + CHECK_S
        stamp = _stamp(self.path)  # type: ignore[arg-type]  # due is inf without a path
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self.tzset()
        return True
