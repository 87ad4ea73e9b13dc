"""The exporter's listening socket, without prometheus_client: the daemon takes its port before the first
tick and builds the exporter after it (:class:`~aithermd.runtime.services.MetricsService`); a scraper that
connects in between waits in the backlog and is answered once the exporter serves."""

from __future__ import annotations

import socket

BACKLOG = 16


def parse_listen(listen: str) -> tuple[str, int] | None:
    """``"HOST:PORT"`` (IPv6 as ``"[::1]:PORT"``) → (host, port); ``"none"`` → None. Raises ValueError."""
    if listen.strip().lower() in ("none", ""):
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics listen address {listen!r}: expected HOST:PORT or 'none'")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``(host, port)`` (port 0: any free one; ``SO_REUSEADDR``). Raises OSError
    when the address cannot be had."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
