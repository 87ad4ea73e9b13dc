"""Helpers for tests that run ``aithermd`` as a real process on a copy of a fixture machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def knob_files(root: Path) -> dict[str, str]:
    """Every ``pwmN`` and ``pwmN_enable`` under the hwmon devices, relative path → content."""
    out = {}
    for path in sorted((root / "devices").rglob("pwm*")):
        if path.is_file() and path.name.removeprefix("pwm").replace("_enable", "").isdigit():
            out[str(path.relative_to(root))] = path.read_text()
    return out


def aithermd(*args: str) -> list[str]:
    return [sys.executable, "-m", "aithermd", *args]


def run_args(root: Path, state: Path, *extra: str) -> list[str]:
    return aithermd("run", "--sysfs-root", str(root), "--state-dir", str(state), "--bus", "none",
                    "--metrics-listen", "none", "--no-nvml", "--log-format", "json", *extra)


def start(args: list[str], env: dict[str, str] | None = None, stderr=subprocess.PIPE) -> subprocess.Popen:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("NOTIFY_SOCKET", None) if env is None or "NOTIFY_SOCKET" not in env else None
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, env=full_env, text=True)


def restore(state: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(aithermd("restore", "--state-dir", str(state), *extra), capture_output=True,
                          text=True, timeout=60)


class NotifySocket:
    """A datagram socket standing in for systemd's."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))

    def wait_for(self, prefix: str, timeout: float = 60.0) -> str:
        """The first message starting with ``prefix`` (waits for it, up to ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                msg = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            if msg.startswith(prefix):
                return msg
        raise AssertionError(f"no {prefix} within {timeout} s")

    def close(self) -> None:
        self.sock.close()


def wait_until(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate()`` every 10 ms until it is true (events, not durations: up to ``timeout_s`` s on a
    loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        time.sleep(0.01)


def catches(pid: int, sig: int) -> bool:
    """True once process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc/PID/status, proc(5))."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (sig - 1) & 1)


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
