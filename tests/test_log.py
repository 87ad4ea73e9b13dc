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


JOURNAL_SNIPPET = """
import os, sys
st = os.fstat(2)
os.environ["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
from aithermd import log
log.setup("info", "auto")
log.get("aithermd.daemon").error("reload_refused", errors=1, path="/etc/aithermd/policies.d/x.yaml")
log.get("aithermd.actuate").info("actuation", device="hwmon:nct6798-isa-0290",
                                 knob="hwmon:nct6798-isa-0290/pwm2", new=60.0, note="two\\nlines")
log.get("aithermd.actuate").debug("not shown")
import logging
logging.getLogger("pyudev").warning("a library warning")
"""


def _native_fields(datagram: bytes) -> dict[str, str]:
    """Parse journald's native protocol (systemd-journald.service(8))."""
    import struct
    fields, rest = {}, datagram
    while rest:
        line, sep, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = after
        else:
            (size,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8:8 + size].decode()
            rest = after[8 + size + 1:]
    return fields


def test_under_journald_each_event_has_its_priority_and_fields(tmp_path):
    """Under systemd ($JOURNAL_STREAM is our stderr) events go over journald's native protocol with
    PRIORITY= of their level and EVENT=/KNOB=/DEVICE= fields; stdlib loggers get a <N> prefix."""
    import socket
    path = tmp_path / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    try:
        with open(tmp_path / "stderr", "w+b") as err:
            out = subprocess.run([sys.executable, "-c", JOURNAL_SNIPPET], stderr=err, timeout=60,
                                 env={**os.environ, "AITHERMD_JOURNAL_SOCKET": str(path)})
            err.seek(0)
            stream = err.read().decode()
        assert out.returncode == 0, stream
        got = [_native_fields(sock.recv(65536)) for _ in range(2)]
    finally:
        sock.close()
    refused, actuation = got
    assert refused["PRIORITY"] == "3" and refused["EVENT"] == "reload_refused"
    assert refused["PATH"] == "/etc/aithermd/policies.d/x.yaml" and refused["ERRORS"] == "1"
    assert refused["SYSLOG_IDENTIFIER"] == "aithermd" and json.loads(refused["MESSAGE"])["errors"] == 1
    assert actuation["PRIORITY"] == "6" and actuation["KNOB"] == "hwmon:nct6798-isa-0290/pwm2"
    assert actuation["DEVICE"] == "hwmon:nct6798-isa-0290" and actuation["NEW"] == "60.0"
    assert actuation["NOTE"] == "two\nlines"  # the binary-safe form
    assert stream.splitlines() == ["<4>WARNING pyudev: a library warning"]


def test_when_journald_refuses_lines_carry_a_priority_prefix(tmp_path):
    out = subprocess.run([sys.executable, "-c", JOURNAL_SNIPPET], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "AITHERMD_JOURNAL_SOCKET": str(tmp_path / "missing")})
    lines = out.stderr.splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<6>", "<4>"], out.stderr
    assert json.loads(lines[0][3:])["event"] == "reload_refused"


def test_debug_enabled_follows_the_configured_level():
    import logging

    import structlog

    from aithermd import log

    before, root = structlog.get_config(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        log.setup("info", "json")
        assert log.debug_enabled() is False
        log.setup("debug", "json")
        assert log.debug_enabled() is True
        structlog.configure(wrapper_class=structlog.BoundLogger)  # no filter: every line passes
        assert log.debug_enabled() is True
    finally:
        structlog.configure(**before)
        root.handlers[:] = handlers
        root.setLevel(level)
