"""Suite-wide set-up: every test starts with structlog writing JSON lines to stderr, as the daemon does;
``clock`` is the simulated clock of :mod:`tests.support.clock` (a fresh one per test)."""

import pytest

from aithermd import log
from tests.support.clock import SimClock


@pytest.fixture(autouse=True)
def _logs_on_stderr():
    log.setup("info", "json")
    yield


@pytest.fixture
def clock() -> SimClock:
    """Monotonic 1000 s, wall 2026-01-01 00:00 UTC; moves only by ``advance`` or ``await clock.sleep``."""
    return SimClock()
