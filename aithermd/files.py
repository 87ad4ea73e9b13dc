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


class UntrustedStateFile(OSError):
    """A state directory or file the daemon must not trust (``errno`` EPERM): owned by another user, or
    writable by group or others, or a symlink where a file was expected. The message names the path, its
    owner and mode, and what to do."""


def _state_problem(st: os.stat_result, path: Path, *, directory: bool) -> str | None:
    me = os.geteuid()
    what = "directory" if directory else "file"
    if st.st_uid not in (me, 0):
        why = f"owned by uid {st.st_uid}, not this daemon's uid {me} (or root)"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = "writable by its group or by every user"
    elif directory != stat.S_ISDIR(st.st_mode) or not (directory or stat.S_ISREG(st.st_mode)):
        why = f"not a {what}"
    else:
        return None
    return (f"{path}: state {what} refused: {why} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); "
            f"anyone who can write it could make the daemon (running as uid {me}) restore or overwrite "
            f"what they choose. If you put it there: chown {me} {path} && chmod go-w {path}; if not, "
            "remove it and find out who did")


def trusted_state_dir(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UntrustedStateFile` unless the state directory ``path`` is owned by this process's
    uid (or root) and writable by nobody else (as sshd's StrictModes); OSError when it cannot be stat'ed."""
    problem = _state_problem(os.stat(path), Path(path), directory=True)
    if problem:
        raise UntrustedStateFile(errno.EPERM, problem, str(path))


def open_state_file(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """An fd of the state file ``path`` (the journal, the lock, operator.json), opened with ``flags``
    plus O_NOFOLLOW (a symlink is refused, ELOOP, never followed) and checked as
    :func:`trusted_state_dir` checks its directory. Raises UntrustedStateFile, OSError (FileNotFoundError
    when there is none and ``flags`` has no O_CREAT)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedStateFile(errno.EPERM, f"{path}: state file refused: a symlink (to "
                                     f"{os.readlink(path)!r}); the daemon never follows one there. Remove "
                                     "it and find out who put it there", str(path)) from None
        raise
    try:
        problem = _state_problem(os.fstat(fd), Path(path), directory=False)
    except OSError:
        os.close(fd)
        raise
    if problem:
        os.close(fd)
        raise UntrustedStateFile(errno.EPERM, problem, str(path))
    return fd


def read_state_file(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the state file ``path`` once :func:`open_state_file` trusts it (``limit`` as for
    :func:`read_regular`). Raises UntrustedStateFile, OSError."""
    fd = open_state_file(path)
    try:
        with open(fd, "rb", closefd=False) as fh:
            return fh.read() if limit is None else fh.read(limit + 1)
    finally:
        os.close(fd)
