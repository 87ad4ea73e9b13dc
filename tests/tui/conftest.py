"""Fixtures for aithermctl tests: fixture documents, a private dbus-daemon, the scripted fake daemon."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dbus import PrivateBus

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent))


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def snapshot_doc() -> dict[str, Any]:
    return load("snapshot.json")


@pytest.fixture
def private_bus() -> Iterator[str]:
    """A private session bus for this test; yields its address."""
    with PrivateBus.start("session") as bus:
        yield bus.address


@pytest.fixture
async def fake_daemon(private_bus: str):
    from fake_daemon import FakeDaemon

    daemon = await FakeDaemon().start(private_bus)
    try:
        yield daemon
    finally:
        daemon.stop()
