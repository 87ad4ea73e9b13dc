"""The narrow I/O seam between the sysfs backends and the filesystem.

Every byte the hwmon and powercap backends read or write goes through a :class:`SysfsIO`; tests replace it
(or one of its methods) to inject faults. :class:`Attribute` keeps one attribute file open and reads it with
``os.pread`` at offset 0, so a sample costs one system call per file; after ``ENODEV``/``ESTALE`` (the device
went away and came back, or the file handle went stale) it re-opens the file once and retries.

Failure classes (kernel sysfs and hwmon ABI, Documentation/hwmon/sysfs-interface.rst: "reading an attribute
may fail with an errno"):

- an ``OSError`` (``EIO``, ``ENODATA``, ``ENXIO``, ``EAGAIN``, ``ENODEV``, ``EACCES``, ``ENOENT``, ...)
  → :attr:`Status.FAILED`, detail ``"EIO: Input/output error"`` (the errno's name first, so that
  :func:`transient` can tell the fault class from the detail);
  ``EOPNOTSUPP`` → :attr:`Status.NOT_SUPPORTED`;
- an empty read, a torn read (every sysfs ``show()`` ends its text with ``"\\n"``; a read without it was cut
  short) or text that is not a number → :attr:`Status.IMPLAUSIBLE`.

Fault classes by errno: the "try again" codes (``EAGAIN``, ``EINTR``, ``EBUSY``: a bus or mutex busy at that
instant, as i2c and pmbus drivers answer) are retried once at once by :meth:`Attribute.read`; those and
the codes of one failed transfer (``EIO``, ``ENODATA`` — a pmbus/i2c read that got no data —, ``ETIMEDOUT``,
``EREMOTEIO``, ``EPROTO``, and ``ENXIO``: what the i2c core and most SMBus adapters (i2c-i801, piix4) answer
when the slave NAKs once, passed through by lm75, jc42, nct7802, emc2103 and pmbus chips; a busy bus — a BMC or an
RGB tool polling it — makes it sporadic) are :data:`TRANSIENT`: one of them is bridged with the last good
value for a bounded time (:mod:`aithermd.backends.trust`), and a device really gone fails its next read too,
which confirms it. The codes of a device or file that is not there (``ENODEV``, ``ENOENT``, ``ESTALE``
after the reopen) or not ours to read (``EACCES``, ``EPERM``) are persistent: the channel fails at once.
"""

from __future__ import annotations

import errno
import os

from aithermd.errors import BackendError, DeviceLost, NoPermission, OutOfRange
from aithermd.model import Status

READ_SIZE = 4096  # one page: a sysfs attribute never holds more (fs/sysfs/file.c)
_REOPEN = frozenset({errno.ENODEV, errno.ESTALE})
_RETRY = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY})
TRANSIENT = frozenset(errno.errorcode[e] for e in (
    errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.EIO, errno.ENODATA, errno.ETIMEDOUT, errno.EREMOTEIO,
    errno.EPROTO, errno.ENXIO))


def transient(detail: str | None) -> bool:
    """True when a failed reading's ``detail`` (``"EIO: Input/output error"``) names a transient errno."""
    return detail is not None and detail.split(":", 1)[0] in TRANSIENT


class SysfsIO:
    """Real file access. Subclass (or replace methods on an instance) to inject faults in tests.

    ``open``/``pread``/``close`` serve kept-open attributes; ``read_text`` serves discovery (labels,
    names, thresholds); ``write`` serves knob writes (open, one ``write``, close: sysfs takes one value per
    write); ``readlink``/``listdir``/``is_dir``/``exists``/``realpath``/``writable`` serve discovery.
    """

    def open(self, path: str) -> int:
        # O_NONBLOCK changes nothing for sysfs attributes; a FIFO in a recorded tree fails (ESPIPE) instead
        # of blocking discovery and the loop for ever
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def pread(self, fd: int, size: int) -> bytes:
        return os.pread(fd, size, 0)

    def close(self, fd: int) -> None:
        os.close(fd)

    def read_bytes(self, path: str) -> bytes:
        fd = self.open(path)
        try:
            return self.pread(fd, READ_SIZE)
        finally:
            self.close(fd)

    def read_text(self, path: str) -> str:
        """The first line of ``path`` without its newline (as libsensors' ``sysfs_read_attr``).

        Raises ``OSError`` when the file cannot be read."""
        return self.read_bytes(path).decode("utf-8", "replace").split("\n", 1)[0]

    def write(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)  # O_TRUNC: as a shell's ">" does
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def writable(self, path: str) -> bool:
        return os.access(path, os.W_OK)

READ_ONLY_MOUNT = ("read-only file system: sysfs is mounted read-only here (a container, or a unit's "
                   "ProtectKernelTunables= without ReadWritePaths=/sys/devices)")


def why_not_writable(io: SysfsIO, path: str) -> str | None:
    """None when ``io`` may write ``path``, else why not, in words (:func:`not_writable_reason`)."""
    return None if io.writable(path) else not_writable_reason(path)


def not_writable_reason(path: str) -> str:
    """Why a file that ``access(W_OK)`` refused cannot be written: a read-only mount (``statvfs``
    ``ST_RDONLY``, EROFS on write), or the caller is not root ("needs root"), or, for root, the file's mode
    or a security module."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return READ_ONLY_MOUNT
    except OSError:
        pass
    if os.geteuid() != 0:
        return "needs root"
    return "permission denied to root (the file's mode, or a security module)"


def errno_name(err: int | None) -> str:
    return errno.errorcode.get(err or 0, f"errno {err}")


def classify_oserror(exc: OSError) -> tuple[Status, str]:
    """``(status, detail)`` for a failed read: ``EOPNOTSUPP`` is a capability, everything else a failure."""
    name = errno_name(exc.errno)
    detail = f"{name}: {os.strerror(exc.errno)}" if exc.errno else str(exc)
    if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
        return Status.NOT_SUPPORTED, detail
    return Status.FAILED, detail


class Nonsense(ValueError):
    """A read that returned something other than one integer and a newline."""


def parse_int(raw: bytes) -> int:
    """The integer in one sysfs read; raises :class:`Nonsense` for empty, torn or non-numeric text."""
    if not raw:
        raise Nonsense("empty read")
    if raw[-1:] != b"\n":
        raise Nonsense(f"torn read {raw[:32]!r}")
    try:
        return int(raw)
    except ValueError:
        raise Nonsense(f"not a number {raw[:32]!r}") from None


class Attribute:
    """One sysfs attribute file, opened on first read and kept open.

    ``read()`` returns the raw bytes (one ``pread`` at offset 0: ``pread(fd, size, offset)``, the seam's) or
    raises ``OSError``; after ``ENODEV`` or
    ``ESTALE`` it closes, re-opens and retries once, after ``EAGAIN``/``EINTR``/``EBUSY`` it retries once.
    A failed open is retried on the next read.
    """

    __slots__ = ("path", "fd", "io", "pread")

    def __init__(self, io: SysfsIO, path: str) -> None:
        self.io = io
        self.path = path
        self.fd = -1
        # the plain seam reads with os.pread itself (one call less per read, the hot path of a sample)
        plain = type(io).pread is SysfsIO.pread and "pread" not in getattr(io, "__dict__", {})
        self.pread = os.pread if plain else (lambda fd, size, _offset: io.pread(fd, size))

    def read(self) -> bytes:
        try:
            return self.pread(self.fd, READ_SIZE, 0)  # fd -1 (not open yet) fails with EBADF: opened below
        except OSError as exc:
            return self.after(exc)

    def after(self, exc: OSError) -> bytes:
        """What :meth:`read` does once its first ``pread`` raised ``exc``: open, re-open or retry, or raise
        (for callers that make the first ``pread(fd, READ_SIZE, 0)`` themselves)."""
        if self.fd < 0:
            self.fd = self.io.open(self.path)
        elif exc.errno in _REOPEN:
            self.close()
            self.fd = self.io.open(self.path)
        elif exc.errno not in _RETRY:
            raise exc
        try:
            return self.pread(self.fd, READ_SIZE, 0)
        except OSError as again:
            if again.errno not in _RETRY or exc.errno in _RETRY:
                raise
            return self.pread(self.fd, READ_SIZE, 0)  # busy right after the (re)open: once more

    def read_int(self) -> int:
        """The attribute as an integer; raises ``OSError`` or :class:`Nonsense`."""
        return parse_int(self.read())

    def write_int(self, value: int) -> None:
        """Write ``value`` as decimal text and a newline (as ``echo N >`` does; ``kstrtol`` in sysfs
        ``store()`` accepts the newline); raises ``OSError``."""
        self.io.write(self.path, b"%d\n" % value)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                self.io.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"Attribute({self.path!r}, fd={self.fd})"


def read_optional_int(io: SysfsIO, path: str) -> int | None:
    """An integer attribute read once at discovery, or None when missing, unreadable or nonsense."""
    try:
        return parse_int(io.read_bytes(path))
    except (OSError, Nonsense):
        return None


def read_optional_text(io: SysfsIO, path: str) -> str | None:
    """A text attribute's first line read once at discovery, or None when missing or unreadable."""
    try:
        return io.read_text(path)
    except OSError:
        return None


def write_error(exc: OSError, what: str, *, denied_hint: str = "needs root") -> BackendError:
    """The :mod:`aithermd.errors` class for a failed sysfs write: EACCES/EPERM → NoPermission (with
    ``denied_hint``), EROFS → NoPermission naming the read-only mount, EINVAL → OutOfRange (the driver
    refused the value), ENODEV/ENOENT → DeviceLost, else BackendError."""
    if exc.errno == errno.EROFS:
        return NoPermission(f"{what}: {READ_ONLY_MOUNT}")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NoPermission(f"{what}: {exc.strerror} ({denied_hint})")
    if exc.errno == errno.EINVAL:
        return OutOfRange(f"{what}: rejected by the driver (EINVAL)")
    if exc.errno in (errno.ENODEV, errno.ENOENT):
        return DeviceLost(f"{what}: {exc.strerror}")
    return BackendError(f"{what}: {exc.strerror or exc}")
