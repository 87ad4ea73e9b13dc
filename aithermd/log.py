"""structlog set-up: always on stderr; JSON lines when stderr is not a terminal, readable on a terminal.

Under systemd (``$JOURNAL_STREAM`` names the device and inode of our stderr, systemd.exec(5)) each event
goes to journald over its native protocol (``/run/systemd/journal/socket``, systemd-journald.service(8)
"Native protocol"): ``MESSAGE=`` is the rendered line, ``PRIORITY=`` the syslog level of the event's level
(so ``journalctl -p warning`` finds warnings), and every field of the event is a journal field of its own
(``EVENT=``, ``KNOB=``, ``DEVICE=``, ``POLICY=``, ...: ``journalctl -u aithermd EVENT=reload_refused``).
When that socket cannot take a datagram, the line goes to stderr with a ``<N>`` priority prefix, which
journald reads from the stream (``SyslogLevelPrefix=`` is on by default). Standard-library loggers get the
``<N>`` prefix on the stream too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import sys
from collections.abc import Mapping
from typing import Any


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

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "aithermd"

# syslog(3) priorities of structlog's and logging's level names
PRIORITY = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "warn": 4, "error": 3, "exception": 3,
            "critical": 2, "fatal": 2}
_NOT_FIELDS = {"level", "timestamp", "event"}  # journald has its own for these


def setup(level: str = "info", fmt: str = "auto", environ: Mapping[str, str] | None = None) -> None:
    """Configure structlog and the stdlib root logger. ``fmt``: ``auto`` | ``json`` | ``console``."""
    env = os.environ if environ is None else environ
    journal = Journal.for_stderr(env)
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() and journal is None else "json"
    renderer = (structlog.processors.JSONRenderer() if fmt == "json"
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty() and journal is None))
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer if journal is None else JournalRenderer(renderer, journal),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, _PrefixFormatter)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrefixFormatter(journal is not None))
    root.addHandler(handler)
    root.setLevel(numeric)


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    """A logger on whatever ``sys.stderr`` is now (not the one at set-up time, which tests may close)."""
    return structlog.PrintLogger(file=sys.stderr)


def get(name: str | None = None) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)


def debug_enabled() -> bool:
    """Whether structlog as configured now passes debug lines: False only under a filtering bound logger
    above debug (:func:`setup` at info or higher), so that a hot path may skip a line that would be dropped
    (a lazy logger binds itself anew at each call, about 8 µs, before the filter drops the line)."""
    check = getattr(structlog.get_config()["wrapper_class"], "is_enabled_for", None)
    return True if check is None else bool(check(None, logging.DEBUG))


class _PrefixFormatter(logging.Formatter):
    def __init__(self, prefix: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self._prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self._prefix:
            return text
        return f"<{PRIORITY.get(record.levelname.lower(), 6)}>" + text.replace("\n", " ")


def field_name(key: str) -> str | None:
    """The journal field for an event key (``knob`` → ``KNOB``), or None for one journald would refuse:
    uppercase ASCII letters, digits and underscores, not starting with ``_`` or a digit, at most 64."""
    name = "".join(c if c.isascii() and c.isalnum() else "_" for c in key.upper()).lstrip("_")
    if not name or name[0].isdigit() or len(name) > 64:
        return None
    return name


def encode(fields: Mapping[str, str]) -> bytes:
    """The native protocol's datagram: ``KEY=value\\n``, or for a value with a newline ``KEY\\n``, its length
    as little-endian 64 bits, the value and ``\\n``."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class Journal:
    """Datagrams to journald's native socket. ``send()`` returns False when the socket refused it."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def for_stderr(cls, environ: Mapping[str, str]) -> Journal | None:
        """A Journal when stderr is the journal stream ``$JOURNAL_STREAM`` names, else None."""
        stream = environ.get("JOURNAL_STREAM", "")
        try:
            dev, ino = (int(part) for part in stream.split(":"))
            st = os.fstat(sys.stderr.fileno())
        except (ValueError, OSError, AttributeError):
            return None
        if (st.st_dev, st.st_ino) != (dev, ino):
            return None
        return cls(environ.get("AITHERMD_JOURNAL_SOCKET", JOURNAL_SOCKET))

    def send(self, fields: Mapping[str, str]) -> bool:
        try:
            self._sock.sendto(encode(fields), self.path)
        except OSError:  # missing socket, or a datagram too large: the stream takes it
            return False
        return True


class JournalRenderer:
    """Last structlog processor under journald: renders the line with ``inner``, sends it with its
    priority and fields, and drops the event; when the send fails it returns the ``<N>``-prefixed line."""

    def __init__(self, inner: Any, journal: Journal) -> None:
        self._inner, self._journal = inner, journal

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> str:
        level = str(event_dict.get("level", method))
        priority = PRIORITY.get(level, 6)
        fields = {"PRIORITY": str(priority), "SYSLOG_IDENTIFIER": IDENTIFIER,
                  "EVENT": str(event_dict.get("event", ""))}
        for key, value in event_dict.items():
            name = field_name(key) if key not in _NOT_FIELDS else None
            if name is None or name in fields or name == "MESSAGE":
                continue
            fields[name] = value if isinstance(value, str) else json.dumps(value, default=str)
        line = self._inner(logger, method, event_dict)
        if self._journal.send({"MESSAGE": line, **fields}):
            raise structlog.DropEvent
        return f"<{priority}>" + line.replace("\n", " ")
