"""A FUSE mirror of a recorded sysfs tree that fails or hangs reads, or refuses writes, of chosen files.

Run with the system python (Debian's python3-fusepy, over libfuse2): ``python3 fusefs.py SOURCE MOUNT
CONTROL``. Every path under MOUNT is SOURCE's (files, directories, symlinks; writes go through), read with
``direct_io`` so each ``pread`` reaches this process as a sysfs read reaches its driver; as in sysfs, a
write replaces the file's value and ``O_TRUNC`` changes nothing. CONTROL is a JSON
file, read again whenever it changes: ``{"PATH-SUFFIX": {"errno": 5}}`` fails reads of matching files with
that errno (``"after": N`` once N reads went through, ``"times": N`` only N reads), ``{"PATH-SUFFIX":
{"hang": true}}`` blocks them until the rule is removed, ``{"PATH-SUFFIX": {"delay": S}}`` makes each
take S s. A key ``"write PATH-SUFFIX"`` fails *writes* of
matching files instead, as a driver's ``store()`` refuses a value (``"data": "1"``: only writes of that
value, surrounding whitespace ignored; ``after``/``times`` as for reads); the refused write changes
nothing. ``{"write PATH-SUFFIX": {"hang": true}}`` blocks writes until the rule is removed, as a driver's
``store()`` blocks on its lock; then the write goes through. The server is multithreaded: a hung read (or
write) blocks only itself. Test data only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations


class Faults:
    def __init__(self, path: str) -> None:
        self.path, self.stamp, self.rules = path, None, {}
        self.lock = threading.Lock()

    def current(self) -> dict:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns)
        except OSError:
            return {}
        with self.lock:
            if stamp != self.stamp:
                try:
                    with open(self.path) as f:
                        self.rules = json.load(f)
                    self.stamp = stamp
                except (OSError, ValueError):
                    pass
            return self.rules

    def rule(self, path: str, op: str = "read") -> tuple[str, dict] | None:
        for key, rule in self.current().items():
            is_write = key.startswith("write ")
            suffix = key[len("write "):] if is_write else key
            if is_write == (op == "write") and path.endswith(suffix):
                return key, rule
        return None

    def take(self, suffix: str, rule: dict) -> bool:
        """True when this read (or write) is to fail; lets ``after`` through, then counts down ``times``."""
        with self.lock:
            if rule.get("after", 0) > 0:
                rule["after"] -= 1
                return False
            times = rule.get("times")
            if times is None:
                return True
            if times <= 0:
                return False
            rule["times"] = times - 1
            return True


class Mirror(Operations):
    def __init__(self, source: str, faults: Faults) -> None:
        self.source, self.faults = source, faults

    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                            "st_atime", "st_mtime", "st_ctime")}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path):
        return os.readlink(self._real(path))

    def open(self, path, flags):
        try:
            return os.open(self._real(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None

    def read(self, path, size, offset, fh):
        hit = self.faults.rule(path)
        if hit is not None:
            suffix, rule = hit
            if rule.get("hang"):
                while (again := self.faults.rule(path)) is not None and again[1].get("hang"):
                    time.sleep(0.02)
            elif rule.get("delay"):  # a slow read (s), then the value: an i2c/EC chip, a disk waking up
                time.sleep(float(rule["delay"]))
            elif "errno" in rule and self.faults.take(suffix, rule):
                raise FuseOSError(int(rule["errno"]))
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        hit = self.faults.rule(path, "write")
        if hit is not None and hit[1].get("hang"):
            while (again := self.faults.rule(path, "write")) is not None and again[1].get("hang"):
                time.sleep(0.02)
            hit = None
        if hit is not None:
            key, rule = hit
            wanted = rule.get("data")
            if (wanted is None or data.strip() == str(wanted).encode()) and self.faults.take(key, rule):
                raise FuseOSError(int(rule["errno"]))
        if offset == 0:  # a sysfs store() replaces the value: the file holds what was last written
            os.ftruncate(fh, 0)
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        pass  # O_TRUNC on a sysfs attribute changes nothing; a refused write leaves the old value

    def release(self, path, fh):
        os.close(fh)

    def access(self, path, amode):
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)


if __name__ == "__main__":
    source, mount, control = sys.argv[1:4]
    FUSE(Mirror(source, Faults(control)), mount, foreground=True, nothreads=False, direct_io=True,
         allow_other=True, attr_timeout=0, entry_timeout=0, default_permissions=False)
