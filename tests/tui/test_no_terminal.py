"""`aithermctl` (the screen) without a terminal hung, drawing escape codes into the pipe: now one line and
exit 2, before anything starts (real processes, stdin /dev/null, stdout a pipe)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "argv, hint",
    [([], ""), (["top"], ""), (["--bus", "session"], ""), (["demo"], " (or `aithermctl demo --no-tui`)")],
)
def test_the_screen_without_a_terminal_is_a_usage_error(argv, hint, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "aithermctl", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"aithermctl's screen needs a terminal; try `aithermctl status`{hint}\n"
    assert list(tmp_path.iterdir()) == []  # the demo started no bus, no daemon
