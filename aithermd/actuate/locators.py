"""Which paths of a journal entry's locator a restore may write under (attack6 G3).

A locator names the root its backend ran on (``sysfs_root``; a fake NVML's ``fake_state`` file). A restore
runs as root, so a root that someone else can write would let them choose what root writes: a copied sysfs
tree of theirs whose ``pwm1`` is a symlink to a root-owned file took "1234" in the finding. An entry is
applied only

- under the daemon's own root: the root of its open backends (the daemon's start and stop), the config's
  ``sysfs_root`` (``aithermd restore``), or the ``--sysfs-root`` given (every entry is relocated there:
  the admin chose it), or
- under another root that only root or this process's user can write (owned by either, writable by neither
  group nor others: a tree aithermd ran on with ``--sysfs-root``, a simulation's tree). A path that does not
  exist is not refused here: the backend's open says what is missing.

Anything else is refused (:func:`refusal`): the entry is kept, the restore fails and says how to restore it
anyway (``--sysfs-root`` names a root the admin vouches for).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

PATH_KEYS = (("sysfs_root", "sysfs root"), ("fake_state", "fake NVML state file"))


def own_roots(backends: Iterable[Any], *more: str | os.PathLike[str] | None) -> frozenset[str]:
    """The real paths of the roots ``backends`` run on, and of ``more`` (None skipped)."""
    roots: set[str] = set()
    for backend in backends:
        try:
            locator = backend.locator()
        except Exception:  # noqa: BLE001 - a backend that cannot say has no root to vouch for
            continue
        roots.update(os.path.realpath(str(locator[k])) for k, _ in PATH_KEYS if locator.get(k))
    roots.update(os.path.realpath(str(p)) for p in more if p is not None)
    return frozenset(roots)


def _not_safe(st: os.stat_result) -> str | None:
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return f"owned by uid {st.st_uid}, neither root nor this process's uid {me}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by its group or by every user"
    return None


def refusal(locator: Mapping[str, Any], own: frozenset[str]) -> str | None:
    """Why the entry of ``locator`` must not be applied (see the module doc), or None. ``own``: the real
    paths of the daemon's own roots (:func:`own_roots`)."""
    for key, what in PATH_KEYS:
        path = locator.get(key)
        if not path or os.path.realpath(str(path)) in own:
            continue
        try:
            st = os.stat(str(path))
        except (OSError, ValueError):
            continue
        why = _not_safe(st)
        if why is None:
            continue
        said = (f"journaled on the {what} {path}, which is not this daemon's and is {why} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): refused, nothing written (whoever can write there would "
                "choose what root writes)")
        return f"{said}; if aithermd did run there, give --sysfs-root {path} to restore it anyway" \
            if key == "sysfs_root" else said
    return None
