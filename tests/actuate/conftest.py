"""The daemon's test fixtures (:mod:`tests.support.daemon`)."""

from tests.support.daemon import policy_dir, settings  # noqa: F401 - fixtures
