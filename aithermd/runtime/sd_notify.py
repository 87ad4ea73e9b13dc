"""The systemd notify protocol (sd_notify(3)), spoken only when ``NOTIFY_SOCKET`` is set.

Messages are newline-separated ``KEY=VALUE`` datagrams sent to the AF_UNIX socket named by
``NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace). The daemon sends ``READY=1`` after its
first tick, ``STATUS=<one line>`` when its status line changes, ``WATCHDOG=1`` every half ``WATCHDOG_USEC``
(only while ticks keep completing, so a hung loop is restarted by systemd) and ``STOPPING=1`` on the way
out. ``WATCHDOG_PID``, when set, must be our pid (sd_watchdog_enabled(3)).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog


class Notifier:
    """One notify socket. Without ``NOTIFY_SOCKET`` every method is a no-op returning False."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._log = structlog.get_logger("aithermd.notify")
        self._address: str | None = None
        self._sock: socket.socket | None = None
        self._last_status: str | None = None
        self._warned = False
        path = env.get("NOTIFY_SOCKET") or ""
        if path.startswith("@"):
            self._address = "\0" + path[1:]
        elif path.startswith("/"):
            self._address = path
        self.watchdog_interval_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval_s = int(usec) / 2_000_000.0
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ...) as one datagram; False when disabled or the send failed."""
        if self._sock is None or self._address is None:
            return False
        try:
            self._sock.sendto("\n".join(fields).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                self._log.warning("notify_failed", socket=self._address.replace("\0", "@"), error=str(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        fields = ["READY=1"]
        if status is not None:
            fields.append(f"STATUS={status}")
            self._last_status = status
        return self.send(*fields)

    def status(self, text: str) -> bool:
        """Send ``STATUS=text`` when it differs from the last one sent."""
        if text == self._last_status:
            return False
        self._last_status = text
        return self.send(f"STATUS={text}")

    def reloading(self) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC`` (CLOCK_MONOTONIC, µs), as Type=notify-reload (systemd
        253 and later) requires before the ``READY=1`` that ends the reload; older systemd shows the unit
        as "reloading" meanwhile."""
        now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={now_us}")

    def reloaded(self) -> bool:
        """``READY=1`` after a reload, accepted or refused (the old policies run on either way)."""
        return self.send("READY=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
