"""Fixtures for aithermctl tests: fixture documents, a private dbus-daemon, the scripted fake daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent))


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def snapshot_doc() -> dict[str, Any]:
    return load("snapshot.json")


@pytest.fixture
def private_bus(tmp_path: Path) -> Iterator[str]:
    """A private ``dbus-daemon --session`` for this test; yields its address."""
    if shutil.which("dbus-daemon") is None:
        pytest.skip("dbus-daemon is not installed (apt install dbus-daemon)")
    proc = subprocess.Popen(["dbus-daemon", "--session", f"--address=unix:path={tmp_path}/bus",
                             "--print-address", "--nofork", "--nopidfile"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def fake_daemon(private_bus: str):
    from fake_daemon import FakeDaemon

    daemon = await FakeDaemon().start(private_bus)
    try:
        yield daemon
    finally:
        daemon.stop()
