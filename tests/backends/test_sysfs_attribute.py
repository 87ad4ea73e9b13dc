"""Attribute reads through the I/O seam: the plain seam reads with os.pread itself, a seam whose ``pread`` is
replaced (a subclass, or one instance's method) still gets every read."""

from __future__ import annotations

import os

from aithermd.backends.sysfs import Attribute, SysfsIO


class CountingIO(SysfsIO):
    def __init__(self) -> None:
        self.preads = 0

    def pread(self, fd: int, size: int) -> bytes:
        self.preads += 1
        return b"41000\n"


def test_the_plain_seam_reads_the_file_and_a_replaced_pread_gets_every_read(tmp_path):
    path = tmp_path / "temp1_input"
    path.write_text("42000\n")
    plain = Attribute(SysfsIO(), str(path))
    assert plain.pread is os.pread
    assert plain.read() == b"42000\n"
    path.write_text("43000\n")  # kept open, read again from offset 0
    assert plain.read_int() == 43000
    plain.close()

    sub = CountingIO()
    counted = Attribute(sub, str(path))
    assert counted.read() == b"41000\n" and counted.read() == b"41000\n"
    assert sub.preads == 2  # every read went through the subclass
    counted.close()

    patched = SysfsIO()
    seen: list[int] = []

    def pread(fd: int, size: int) -> bytes:
        seen.append(fd)
        return b"7\n"

    patched.pread = pread  # type: ignore[method-assign]
    one = Attribute(patched, str(path))
    assert one.read_int() == 7 and seen
    one.close()
