"""Trace files that are not plain UTF-8 files: a FIFO hung ``replay``, ``/dev/zero`` ate all memory, and a
byte that is not UTF-8 was reported without its line."""

from __future__ import annotations

import os

import pytest

from aithermd.cli import main
from aithermd.policy.trace import TraceError, read_trace_text

HEADER = "timestamp, name, utilization.gpu [%], power.draw [W]\n"
ROW = "2026/01/03 15:36:53.507, NVIDIA GeForce RTX 4090, 1 %, 33.09 W\n"


def test_a_fifo_or_device_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(OSError) as info:
            read_trace_text(path)
        assert info.value.strerror == "not a regular file"


def test_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "t.csv"
    good = (HEADER + ROW + ROW).encode()
    path.write_bytes(good + b"2026/01/03 15:36:56.518, \xff, 1 %, 33 W\n")
    with pytest.raises(TraceError) as info:
        read_trace_text(path)
    at = len(good) + len("2026/01/03 15:36:56.518, ")
    assert info.value.line == 4
    assert str(info.value) == f"{path}:4: not UTF-8 text (invalid start byte at byte {at})"
    assert read_trace_text(path, errors="replace").count("\n") == 4  # the simulator's lenient reading


def test_replay_exits_1_with_the_line_and_2_for_a_fifo(tmp_path, capsys):
    path = tmp_path / "t.csv"
    good = (HEADER + ROW).encode()
    path.write_bytes(good + b"\xfe\n")
    assert main(["replay", "--trace", str(path), "--policy", "ai-training"]) == 1
    assert capsys.readouterr().err == (f"aithermd replay: malformed trace: {path}:3: not UTF-8 text "
                                       f"(invalid start byte at byte {len(good)})\n")
    fifo = tmp_path / "f.csv"
    os.mkfifo(fifo)
    assert main(["replay", "--trace", str(fifo), "--policy", "ai-training"]) == 2
    assert capsys.readouterr().err == f"aithermd replay: {fifo}: cannot read: not a regular file\n"
