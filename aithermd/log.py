"""structlog set-up: always on stderr; JSON lines when stderr is not a terminal (journald), readable
on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def setup(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog and the stdlib root logger. ``fmt``: ``auto`` | ``json`` | ``console``."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(levelname)s %(name)s: %(message)s")


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    """A logger on whatever ``sys.stderr`` is now (not the one at set-up time, which tests may close)."""
    return structlog.PrintLogger(file=sys.stderr)


def get(name: str | None = None) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
