"""Suite-wide set-up: every test starts with structlog writing JSON lines to stderr, as the daemon does."""

import pytest

from aithermd import log


@pytest.fixture(autouse=True)
def _logs_on_stderr():
    log.setup("info", "json")
    yield
