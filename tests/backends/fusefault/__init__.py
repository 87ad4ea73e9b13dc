"""Fault injection at the syscall level: a recorded sysfs tree behind FUSE (see fusefs.py).

:func:`fuse_unavailable` says why FUSE cannot be used here (None when it can); :class:`FaultyTree` mounts a
copy of a tree, sets faults (``fail(suffix, errno)``, ``fail_write(suffix, errno, data)``, ``hang(suffix)``,
``slow(suffix, s)``, ``hang_write(suffix)``, ``clear()``) and unmounts.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SERVER = Path(__file__).with_name("fusefs.py")
SYSTEM_PYTHON = "/usr/bin/python3"


@functools.lru_cache(maxsize=1)
def fuse_unavailable() -> str | None:
    """Why no FUSE mount can be made here, or None (checked once, by mounting an empty tree)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse in this environment (install fuse3 / load the fuse module)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not usable by this user (FUSE tests run as root)"
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} is missing"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import fusepy"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "the system python lacks fusepy (Debian package python3-fusepy, scripts/system-packages.txt)"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "src").mkdir()
        try:
            with FaultyTree(Path(tmp) / "src", Path(tmp)):
                pass
        except RuntimeError as exc:
            return f"a FUSE mount fails here ({exc}): an unprivileged container?"
    return None


class FaultyTree:
    """A FUSE mount of ``source`` (a sysfs tree) at ``base/mnt``; use as a context manager."""

    def __init__(self, source: Path, base: Path) -> None:
        self.source, self.mount, self.control = source, base / "mnt", base / "faults.json"
        self.rules: dict[str, dict] = {}
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> FaultyTree:
        self.mount.mkdir(parents=True, exist_ok=True)
        self._write()
        self._proc = subprocess.Popen([SYSTEM_PYTHON, str(SERVER), str(self.source), str(self.mount),
                                       str(self.control)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(200):  # up to ~10 s for the mount to appear
            if os.path.ismount(self.mount):
                return self
            if self._proc.poll() is not None:
                out = self._proc.stdout.read().decode(errors="replace") if self._proc.stdout else ""
                raise RuntimeError(f"FUSE server exited {self._proc.returncode}: {out.strip()}")
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError("FUSE mount did not appear")

    def __exit__(self, *exc: object) -> None:
        self.rules.clear()
        self._write()  # release hung reads first
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _write(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rules))
        os.replace(tmp, self.control)
        time.sleep(0.01)  # a distinct mtime for the next change

    def fail(self, suffix: str, code: int, times: int | None = None, after: int = 0) -> None:
        self.rules[suffix] = ({"errno": code, "after": after}
                              | ({"times": times} if times is not None else {}))
        self._write()

    def fail_write(self, suffix: str, code: int, data: str | None = None, times: int | None = None) -> None:
        """Refuse writes to files ending in ``suffix`` with ``code`` (only writes of ``data`` when given), as
        a driver's ``store()`` does; the file keeps its value."""
        self.rules["write " + suffix] = ({"errno": code} | ({"data": data} if data is not None else {})
                                         | ({"times": times} if times is not None else {}))
        self._write()

    def hang(self, suffix: str) -> None:
        self.rules[suffix] = {"hang": True}
        self._write()

    def slow(self, suffix: str, delay_s: float) -> None:
        """Every read of files ending in ``suffix`` answers after ``delay_s`` (s)."""
        self.rules[suffix] = {"delay": delay_s}
        self._write()

    def hang_write(self, suffix: str) -> None:
        """Block writes to files ending in ``suffix`` until cleared, as a driver's ``store()`` stuck on its
        lock; then they go through."""
        self.rules["write " + suffix] = {"hang": True}
        self._write()

    def clear(self, suffix: str | None = None) -> None:
        if suffix is None:
            self.rules.clear()
        else:
            self.rules.pop(suffix, None)
            self.rules.pop("write " + suffix, None)
        self._write()


def copy_tree(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, symlinks=True)
    return dest
