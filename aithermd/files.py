"""Reading the files people hand aithermd (policies, the config, traces, nvidia-smi dumps) safely.

A FIFO named like one of them would block a reader for ever, and ``/dev/zero`` would never end: each is
opened with ``O_NONBLOCK``, must be a regular file, and is read up to a limit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """The path is a FIFO, device, socket or directory (``errno`` EINVAL, ``strerror`` "not a regular
    file")."""


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``: all of them, or at most ``limit + 1`` so that a caller
    can tell a file over ``limit`` bytes. Raises :class:`NotRegularFile`, or OSError when it cannot be
    opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        with open(fd, "rb", closefd=False) as fh:
            return fh.read() if limit is None else fh.read(limit + 1)
    finally:
        os.close(fd)



def path_arg(text: str) -> Path:
    """argparse ``type=`` of a path on the command line: an empty one is refused (``Path("")`` is the
    current directory, so ``--state-dir ""`` wrote the daemon's files where it was started). Raises
    argparse.ArgumentTypeError, which argparse reports as a usage error (exit 2)."""
    return Path(nonempty_arg(text))


def nonempty_arg(text: str) -> str:
    """argparse ``type=`` of a name or path kept as text (``--policy NAME|FILE``): not empty or blank."""
    if not text.strip():
        import argparse
        raise argparse.ArgumentTypeError("is empty: give a path or a name (an empty path would mean the "
                                         "current directory)")
    return text
