"""structlog set-up: always on stderr; JSON lines when stderr is not a terminal (journald), readable
on a terminal."""

from __future__ import annotations

import logging
import sys


def _structlog_without_rich():  # type: ignore[no-untyped-def]
    """Import structlog as if rich were not installed (unless either is already imported). structlog's
    dev and tracebacks modules import rich when it is there (the TUI's textual brings it): 6 MB of RSS and
    a tenth of a second of start-up for a daemon that never renders with it. ``sys.modules[name] = None``
    makes that import fail the documented way; the entry is removed again, so a later ``import rich``
    (another program in the same interpreter) works."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        import structlog
        return structlog
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog
    finally:
        if sys.modules.get("rich", 0) is None:
            del sys.modules["rich"]
    return structlog


structlog = _structlog_without_rich()


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
