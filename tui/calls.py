"""Calls to aithermd, whichever connection carries them; and :class:`BlockingClient`, the one-shot verbs'.

What both clients share: the decoding and checking of the JSON documents the daemon answers with, the line
for a socket error and who owns a hold (arguments are checked by :mod:`aithermctl.bus_args`).

:class:`BlockingClient` makes one blocking connection with jeepney and no event loop: ``aithermctl status``
needs no more, and so skips importing asyncio and dbus-fast (about two thirds of its start-up CPU on the
2-core build VM, ``benchmarks/bench_ctl_startup.py``). It speaks only the ``unix:`` transports; for another
address :meth:`BlockingClient.connect` raises :class:`Unsupported` and the caller takes the asyncio client
(:class:`aithermctl.client.DaemonClient`, dbus-fast), which also follows signals for the TUI and the verbs
that wait.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aithermctl import errors
from aithermctl.bus_args import check_args
from aithermd.publish import wire

DBUS = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")


class Unsupported(Exception):
    """The bus address has no ``unix:`` transport (``tcp:``), or jeepney cannot read it (no session bus
    address): use the dbus-fast client (which also says what is wrong with an address)."""


def reason(exc: BaseException) -> str:
    """A socket or connection error in a few words ("no socket (/run/dbus/...)", "connection refused")."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"no socket ({exc.filename or text})" if exc.filename else "no bus socket"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return " ".join(text.split())


def decode(member: str, text: Any) -> Any:
    """``member``'s JSON answer, decoded. Raises DaemonError for something that is not JSON."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise errors.DaemonError(f"aithermd answered {member} with something that is not JSON ({exc}); "
                                 "update aithermd and aithermctl together") from exc


def checked(member: str, doc: Any, schema: Any) -> Any:
    """``doc`` checked against ``schema`` (a :mod:`~aithermd.publish.wire` type; members a newer daemon
    added pass). Raises DaemonError for a document of another shape."""
    try:
        return wire.check(doc, schema, strict=False)
    except wire.DocumentError as exc:
        raise errors.DaemonError(f"aithermd answered {member} with a document aithermctl cannot read "
                                 f"({exc}); update aithermd and aithermctl together") from exc


def owner_text(uid: int, pid: int) -> str:
    """A bus connection's owner for people: ``"alice: python3 (pid 4242)"``; the user name from the
    password database, the command from ``/proc/PID/comm``."""
    import pwd

    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid {uid}"
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            command = f.read().strip()
    except OSError:
        return f"{user} (pid {pid})"
    return f"{user}: {command} (pid {pid})"


class BlockingClient:
    """One blocking connection to ``bus`` (``"system"``, ``"session"`` or a ``unix:`` address) for the
    daemon's read methods; ``timeout_s`` bounds the connection and each call. Raises the errors of
    :mod:`aithermctl.errors`, :class:`Unsupported` for an address without a ``unix:`` transport."""

    def __init__(self, bus: str = "system", timeout_s: float = 30.0) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self._conn: Any = None

    def connect(self) -> None:
        from jeepney.bus import get_connectable_addresses
        from jeepney.io.blocking import open_dbus_connection

        target = "SYSTEM"
        if self.bus != "system":
            target = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "") if self.bus == "session" else self.bus
            try:
                next(get_connectable_addresses(target))
            except (RuntimeError, ValueError) as exc:  # tcp:, no address, or not an address at all
                raise Unsupported(self.bus) from exc
        try:
            self._conn = open_dbus_connection(bus=target, auth_timeout=self.timeout_s)
        except Exception as exc:  # socket missing or refused, authentication failed or timed out
            raise errors.BusUnreachable(self.bus, reason(exc)) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> BlockingClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raw(self, target: tuple[str, str, str], member: str, signature: str, body: tuple[Any, ...]) -> list:
        from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call

        msg = new_method_call(DBusAddress(target[1], bus_name=target[0], interface=target[2]), member,
                              signature or None, body)
        try:
            reply = self._conn.send_and_get_reply(msg, timeout=self.timeout_s)
        except TimeoutError as exc:
            raise errors.NoReply(f"aithermd did not answer {member} within {self.timeout_s:g} s; check it "
                                 "with: journalctl -u aithermd") from exc
        except Exception as exc:  # the connection broke under the call
            self.close()
            raise errors.BusUnreachable(self.bus, f"connection lost ({reason(exc)})") from exc
        if reply.header.message_type == MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "")
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise errors.from_dbus(name, text, member, self.bus)
        return list(reply.body)

    def call(self, member: str, *args: Any) -> Any:
        """Call ``member`` of the daemon's interface with ``args``; the single return value (or None)."""
        signature = wire.METHODS[member][0]
        check_args(member, signature, args)
        body = self._raw((wire.BUS_NAME, wire.OBJECT_PATH, wire.INTERFACE), member, signature, args)
        return body[0] if body else None

    def get_snapshot(self) -> wire.SnapshotDoc:
        """The snapshot document (:class:`~aithermd.publish.wire.SnapshotDoc`)."""
        return checked("GetSnapshot", decode("GetSnapshot", self.call("GetSnapshot")), wire.SnapshotDoc)

    def describe_owner(self, name: str) -> str | None:
        """Who bus connection ``name`` is (:func:`owner_text`), from the bus daemon's
        GetConnectionUnixUser and GetConnectionUnixProcessID; None when it is gone."""
        try:
            (uid,) = self._raw(DBUS, "GetConnectionUnixUser", "s", (name,))
            (pid,) = self._raw(DBUS, "GetConnectionUnixProcessID", "s", (name,))
        except errors.ClientError:
            return None
        return owner_text(uid, pid)
