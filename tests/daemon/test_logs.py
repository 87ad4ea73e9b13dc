"""structlog on stderr: JSON lines when stderr is not a terminal (journald), readable on a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

SNIPPET = """
from aithermd import log
log.setup("info", "auto")
log.get("aithermd.actuate").info("actuation", device="hwmon:nct6798-isa-0290",
                                 knob="hwmon:nct6798-isa-0290/pwm2", old=35.3, new=60.0, unit="%",
                                 rule="balanced/case-fans")
"""


def test_auto_writes_one_json_line_per_event_when_stderr_is_a_pipe():
    out = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert {k: event[k] for k in ("event", "device", "knob", "old", "new", "unit", "rule")} == {
        "event": "actuation", "device": "hwmon:nct6798-isa-0290", "knob": "hwmon:nct6798-isa-0290/pwm2",
        "old": 35.3, "new": 60.0, "unit": "%", "rule": "balanced/case-fans"}
    assert event["level"] == "info"


def test_auto_is_readable_text_on_a_terminal():
    main, child = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", SNIPPET], stderr=child, stdout=subprocess.DEVNULL,
                              timeout=60)
        os.close(child)
        child = -1
        chunks = []
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:  # EIO once the writer closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if child >= 0:
            os.close(child)
        os.close(main)
    assert proc.returncode == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode())
    assert not text.lstrip().startswith("{")
    assert "actuation" in text and "knob=hwmon:nct6798-isa-0290/pwm2" in text and "new=60.0" in text
