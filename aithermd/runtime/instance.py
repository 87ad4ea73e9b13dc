"""One daemon per machine: a lock in the state directory and one in the runtime directory (``/run``).

Two daemons on the same machine would drive the same fans and limits against each other, and the second
one's start-up would "restore" the first one's settings from the shared journal. The D-Bus name is no
guard: a daemon started with ``--bus none`` or on another bus, or while the bus is down, owns none. So the
daemon takes two ``flock(2)`` locks before it reads the journal, and holds them for its life (the kernel
drops them when the process ends, however it ends):

- ``<state_dir>/aithermd.lock``: the journal's owner — a second daemon with the same state directory;
- ``<runtime_dir>/aithermd.lock`` for the machine's own ``/sys`` (``aithermd-<hash>.lock`` for another
  sysfs root, so simulations and tests on their own trees never collide): a second daemon on the same
  hardware with another state directory. A runtime directory that cannot be created (no root, a read-only
  ``/run``) leaves only the state-directory lock, with a warning.

Each lock file holds the owner's pid, so the refusal names it. ``aithermd restore`` checks the same state
lock: it refuses to restore under a running daemon (which restores on its own when it stops).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from pathlib import Path

import structlog

from aithermd.errors import AithermError
from aithermd.files import open_state_file, trusted_state_dir

LOCK_FILE = "aithermd.lock"
DEFAULT_RUNTIME_DIR = Path("/run/aithermd")


class AlreadyRunning(AithermError):
    """Another aithermd holds the lock: the message names the file and its pid."""


def machine_lock_path(runtime_dir: Path, sysfs_root: Path, machine_sysfs: str = "/sys") -> Path:
    """The runtime-directory lock for ``sysfs_root``: ``aithermd.lock`` for the machine's own sysfs."""
    root = os.path.realpath(sysfs_root)
    if root == os.path.realpath(machine_sysfs):
        return runtime_dir / LOCK_FILE
    return runtime_dir / f"aithermd-{hashlib.sha256(root.encode()).hexdigest()[:12]}.lock"


def _owner(path: Path) -> str:
    try:
        pid = path.read_text().split()[0]
    except (OSError, IndexError):
        return "another aithermd"
    return f"another aithermd (pid {pid})"


def _take(path: Path, what: str) -> int:
    """Open ``path`` (:func:`~aithermd.files.open_state_file`) and lock it; the fd. Raises AlreadyRunning,
    UntrustedStateFile, OSError."""
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT, 0o644)  # never through a symlink, never another's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise AlreadyRunning(f"{_owner(path)} is running on {what} (it holds {path}): stop it first "
                                 "(systemctl stop aithermd), or give this one its own --state-dir and "
                                 "--sysfs-root") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


class InstanceLock:
    """The two locks of one daemon run (see the module doc): :meth:`acquire`, then :meth:`release` (or let
    the process end)."""

    def __init__(self, state_dir: Path, sysfs_root: Path, runtime_dir: Path = DEFAULT_RUNTIME_DIR) -> None:
        self.state_path = Path(state_dir) / LOCK_FILE
        self.machine_path = machine_lock_path(Path(runtime_dir), Path(sysfs_root))
        self.sysfs_root = Path(sysfs_root)
        self._fds: list[int] = []

    def acquire(self) -> None:
        """Take both locks. Raises AlreadyRunning (nothing held then), UntrustedStateFile for a state
        directory or lock file owned by another user or writable by others, or a symlinked lock, OSError
        for a state directory that cannot hold its lock."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        trusted_state_dir(self.state_path.parent)  # others can write it: UntrustedStateFile
        self._fds.append(_take(self.state_path, f"state directory {self.state_path.parent}"))
        try:
            self.machine_path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            self._fds.append(_take(self.machine_path, f"this machine ({self.sysfs_root})"))
        except AlreadyRunning:
            self.release()
            raise
        except OSError as exc:
            structlog.get_logger("aithermd.instance").warning(
                "machine_lock_unavailable", path=str(self.machine_path), error=exc.strerror,
                message="only the state-directory lock guards against a second daemon")

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.close(fd)  # closing drops the flock
            except OSError:
                pass


def held_by_other(state_dir: Path) -> str | None:
    """Who holds ``state_dir``'s daemon lock (``"another aithermd (pid N)"``), or None when nobody does."""
    path = Path(state_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _owner(path)
    finally:
        os.close(fd)
    return None
