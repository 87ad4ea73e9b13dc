"""DaemonClient: aithermctl's only way to aithermd, over D-Bus with dbus-fast.

Every method of ``io.github.aithermd.Daemon1`` (names and signatures in :mod:`aithermd.publish.wire`) has
a typed async method here; JSON documents come back decoded, and the snapshot and history documents
checked against their types (:class:`~aithermd.publish.wire.SnapshotDoc`, :class:`~aithermd.publish.wire.
HistoryDoc`; members a newer daemon added pass). Failures raise the exceptions of
:mod:`aithermctl.errors` (``DaemonNotRunning``, ``NotAuthorized``, ``Rejected``, ``BusUnreachable``, ...),
never a raw D-Bus error. :meth:`DaemonClient.snapshots` follows the ``SnapshotUpdated`` signal (with a
polling fallback) and :meth:`DaemonClient.events` the ``Event`` signal; :meth:`DaemonClient.connect` is
idempotent and reconnects after the bus went away, so a follower reconnects by calling it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from dbus_fast import BusType, DBusError, Message, MessageFlag, MessageType, Variant
from dbus_fast.aio import MessageBus

from aithermctl import errors
from aithermctl.bus_args import check_args
from aithermctl.calls import DBUS, checked, decode, owner_text, reason
from aithermd.publish import wire

PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
PRIVILEGED = frozenset({"SetActivePolicy", "HoldPolicy", "ReleasePolicy", "SetOverride", "ClearOverride",
                        "Reload", "ReleaseGpu", "ReportProgress"})
Listener = Callable[[str, list[Any]], None]


class DaemonClient:
    """A connection to aithermd on ``bus`` (``"system"``, ``"session"`` or a D-Bus address).

    ``timeout_s`` bounds each call (a slow polkit prompt included). Use as ``async with DaemonClient(...)``
    or call :meth:`connect` / :meth:`close`.
    """

    def __init__(self, bus: str = "system", timeout_s: float = 30.0, *, ask_password: bool = True) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self.ask_password = ask_password
        # the calls that change something let polkit ask for a password (ALLOW_INTERACTIVE_AUTHORIZATION)
        self._privileged_flags = (MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION if ask_password
                                  else MessageFlag.NONE)
        self._conn: MessageBus | None = None
        self._listeners: set[Listener] = set()
        self._watch: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None
        # connections made so far: a new one means the last was lost, and whatever was tied to it (a hold)
        # with it; a restarted bus hands out the same unique names again, so they cannot tell
        self.connections = 0

    # connection ---------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.connected

    async def connect(self) -> None:
        """Connect to the bus (again, if the connection was lost) and subscribe to the daemon's signals.
        Raises BusUnreachable."""
        if self.connected:
            return
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # two followers reconnecting at once make one connection
            if not self.connected:
                await self._connect()

    async def _connect(self) -> None:
        await self._drop()
        try:  # the constructor parses the address: a malformed one, or no session bus, fails here
            if self.bus == "system":
                conn = MessageBus(bus_type=BusType.SYSTEM)
            elif self.bus == "session":
                conn = MessageBus(bus_type=BusType.SESSION)
            else:
                conn = MessageBus(bus_address=self.bus)
            await asyncio.wait_for(conn.connect(), self.timeout_s)
        except Exception as exc:  # socket missing or refused, auth failed, bad address, timeout
            raise errors.BusUnreachable(self.bus, reason(exc)) from exc
        self._conn = conn
        self.connections += 1
        conn.add_message_handler(self._on_message)
        for rule in (f"type='signal',sender='{wire.BUS_NAME}',interface='{wire.INTERFACE}'",
                     f"type='signal',sender='{DBUS[0]}',interface='{DBUS[2]}',member='NameOwnerChanged',"
                     f"arg0='{wire.BUS_NAME}'"):
            await self._raw(DBUS, "AddMatch", "s", [rule])
        self._watch = asyncio.get_running_loop().create_task(self._watch_disconnect(conn))

    async def close(self) -> None:
        await self._drop()

    async def __aenter__(self) -> DaemonClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()

    async def _watch_disconnect(self, conn: MessageBus) -> None:
        with contextlib.suppress(Exception):
            await conn.wait_for_disconnect()
        self._notify("Disconnected", [])

    def _on_message(self, msg: Message) -> None:
        if msg.message_type is not MessageType.SIGNAL:
            return
        if msg.interface == wire.INTERFACE and msg.path == wire.OBJECT_PATH:
            self._notify(msg.member, list(msg.body))
        elif msg.interface == DBUS[2] and msg.member == "NameOwnerChanged" and msg.body[0] == wire.BUS_NAME:
            self._notify("NameOwnerChanged", list(msg.body))

    @contextlib.contextmanager
    def listening(self, listener: Listener) -> Iterator[None]:
        """Inside: ``listener(member, body)`` for each of the daemon's signals (``Event``,
        ``SnapshotUpdated``), its ``NameOwnerChanged`` and ``Disconnected`` (once connected)."""
        self._listeners.add(listener)
        try:
            yield
        finally:
            self._listeners.discard(listener)

    def _notify(self, member: str, body: list[Any]) -> None:
        for listener in tuple(self._listeners):
            listener(member, body)

    # calls --------------------------------------------------------------------------------------------
    async def _raw(self, target: tuple[str, str, str], member: str, signature: str, body: list[Any],
                   flags: MessageFlag = MessageFlag.NONE) -> list[Any]:
        if self._conn is None or not self._conn.connected:
            raise errors.BusUnreachable(self.bus, "not connected")
        msg = Message(destination=target[0], path=target[1], interface=target[2], member=member,
                      signature=signature, body=body, flags=flags)
        try:
            reply = await asyncio.wait_for(self._conn.call(msg), self.timeout_s)
        except TimeoutError as exc:
            raise errors.NoReply(f"aithermd did not answer {member} within {self.timeout_s:g} s; check it "
                                 "with: journalctl -u aithermd") from exc
        except DBusError as exc:
            raise errors.from_dbus(str(exc.type), exc.text, member, self.bus) from exc
        except Exception as exc:  # the connection broke under the call
            await self._drop()
            raise errors.BusUnreachable(self.bus, f"connection lost ({reason(exc)})") from exc
        if reply.message_type is MessageType.ERROR:
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise errors.from_dbus(reply.error_name or "", text, member, self.bus)
        return list(reply.body)

    async def call(self, member: str, *args: Any) -> Any:
        """Call ``member`` of the daemon's interface with ``args``; the first return value (or None).
        Raises the errors of :mod:`aithermctl.errors`."""
        body = await self.call_all(member, *args)
        return body[0] if body else None

    async def call_all(self, member: str, *args: Any) -> list[Any]:
        """As :meth:`call`, every return value."""
        signature = wire.METHODS[member][0]
        check_args(member, signature, args)
        await self.connect()
        flags = self._privileged_flags if member in PRIVILEGED else MessageFlag.NONE
        return list(await self._raw((wire.BUS_NAME, wire.OBJECT_PATH, wire.INTERFACE), member, signature,
                                    list(args), flags))

    async def _json(self, member: str, *args: Any) -> Any:
        return decode(member, await self.call(member, *args))

    async def _document(self, member: str, schema: Any, *args: Any) -> Any:
        """``member``'s JSON answer checked against ``schema`` (a :mod:`~aithermd.publish.wire` type)."""
        return checked(member, await self._json(member, *args), schema)

    async def get_property(self, name: str) -> Any:
        """The value of daemon property ``name`` (see ``wire.PROPERTIES``)."""
        await self.connect()
        body = await self._raw((wire.BUS_NAME, wire.OBJECT_PATH, PROPERTIES_IFACE), "Get", "ss",
                               [wire.INTERFACE, name])
        value = body[0]
        return value.value if isinstance(value, Variant) else value

    async def name_has_owner(self, name: str = wire.BUS_NAME) -> bool:
        """Whether someone owns bus name ``name`` (the daemon by default; also used for polkit)."""
        await self.connect()
        return bool((await self._raw(DBUS, "NameHasOwner", "s", [name]))[0])

    async def name_owner(self, name: str = wire.BUS_NAME) -> str | None:
        """The unique name (``:1.42``) owning bus name ``name`` now, None when nobody does: a new one after
        the daemon restarted. Raises BusUnreachable."""
        await self.connect()
        try:
            return str((await self._raw(DBUS, "GetNameOwner", "s", [name]))[0])
        except errors.DaemonNotRunning:  # org.freedesktop.DBus.Error.NameHasNoOwner
            return None

    async def describe_owner(self, name: str) -> str | None:
        """Who bus connection ``name`` (a hold's owner, ``:1.42``) is, for people: ``"alice: python3 (pid
        4242)"``: its uid and pid from the bus daemon (GetConnectionUnixUser, GetConnectionUnixProcessID),
        the user name from the password database, the command from ``/proc/PID/comm``. None when the
        connection is gone or the bus does not say."""
        try:
            (uid,) = await self._raw(DBUS, "GetConnectionUnixUser", "s", [name])
            (pid,) = await self._raw(DBUS, "GetConnectionUnixProcessID", "s", [name])
        except errors.ClientError:
            return None
        return owner_text(uid, pid)

    # the daemon's methods, typed ----------------------------------------------------------------------
    async def get_snapshot(self) -> wire.SnapshotDoc:
        """The snapshot document (:class:`~aithermd.publish.wire.SnapshotDoc`). Raises DaemonError for a
        document of another shape."""
        return await self._document("GetSnapshot", wire.SnapshotDoc)

    async def get_history(self, seconds: float) -> wire.HistoryDoc:
        """The last ``seconds`` as columns (:class:`~aithermd.publish.wire.HistoryDoc`). Raises DaemonError
        for a document of another shape."""
        return await self._document("GetHistory", wire.HistoryDoc, float(seconds))

    async def explain(self, knob_id: str = "") -> dict[str, Any]:
        """``{knob_id: {"value", "requested", "rule", "reason", "inputs", ...}}``; all knobs with ``""``."""
        return await self._json("Explain", knob_id)

    async def list_policies(self) -> list[dict[str, Any]]:
        """``[{"name", "path", "description", "active"}]``."""
        return await self._json("ListPolicies")

    async def get_policy(self, name: str) -> dict[str, Any]:
        """``{"name", "path", "source", "description"}``."""
        return await self._json("GetPolicy", name)

    async def set_active_policy(self, name: str) -> None:
        await self.call("SetActivePolicy", name)

    async def hold_policy(self, policy: str, reason: str, timeout_s: float = 0.0,
                          detached: bool = False) -> int:
        """Hold ``policy`` on top of the active one; returns the cookie. Not ``detached``: the hold ends when
        this connection closes."""
        return int(await self.call("HoldPolicy", policy, reason, float(timeout_s), bool(detached)))

    async def release_policy(self, cookie: int) -> None:
        await self.call("ReleasePolicy", int(cookie))

    async def set_override(self, knob_id: str, value: float, seconds: float = 0.0) -> tuple[float, list[str]]:
        """Override ``knob_id`` to ``value`` (daemon units: W, %) for ``seconds`` (0 = until cleared); returns
        the value the daemon applied (clamped when just outside the knob's range) and its warnings (a fan
        stopped until cleared; none from a daemon that sends only the value)."""
        body = await self.call_all("SetOverride", knob_id, float(value), float(seconds))
        applied = float(body[0]) if body else float(value)
        warnings = [str(w) for w in body[1]] if len(body) > 1 and isinstance(body[1], list) else []
        return applied, warnings

    async def clear_override(self, knob_id: str) -> None:
        await self.call("ClearOverride", knob_id)

    async def release_gpu(self, device_id: str) -> str:
        """Restore GPU ``device_id``'s originals and have the daemon stop using it; returns what was done."""
        return str(await self.call("ReleaseGpu", device_id))

    async def reload(self) -> None:
        await self.call("Reload")

    async def report_progress(self, gpus: list[str], rate: float) -> None:
        """A job's own progress rate (steps/s) on ``gpus``, held by the daemon for 30 s."""
        await self.call("ReportProgress", list(gpus), float(rate))

    async def start_scoped_energy_window(self, name: str, timeout_s: float, scope: str) -> int:
        """A window that also sums ``scope``'s own joules; falls back to a device-only window on a daemon
        without scoped windows."""
        try:
            return int(await self.call("StartScopedEnergyWindow", name, float(timeout_s), scope))
        except errors.ClientError as exc:
            if exc.dbus_name != "org.freedesktop.DBus.Error.UnknownMethod":
                raise
        return await self.start_energy_window(name, timeout_s)

    async def start_energy_window(self, name: str, timeout_s: float) -> int:
        return int(await self.call("StartEnergyWindow", name, float(timeout_s)))

    async def energy_report(self, since: float, by: str) -> dict[str, Any]:
        return await self._json("GetEnergyReport", float(since), by)

    async def get_processes(self) -> dict[str, Any]:
        return await self._json("GetProcesses")

    async def stop_energy_window(self, window_id: int) -> dict[str, Any]:
        """``{"name", "duration_s", "joules": {device_id: J}}``."""
        return await self._json("StopEnergyWindow", int(window_id))

    async def holds(self) -> list[dict[str, Any]]:
        """The ``Holds`` property, decoded: ``[{"cookie", "policy", "reason", "owner", "detached",
        "expires"}]``."""
        return json.loads(await self.get_property("Holds") or "[]")

    # following ----------------------------------------------------------------------------------------
    async def snapshots(self, poll_s: float = 5.0) -> AsyncIterator[wire.SnapshotDoc]:
        """The current snapshot, then a fresh one after each ``SnapshotUpdated`` signal (bursts coalesce),
        or every ``poll_s`` seconds when no signal comes. Ends by raising DaemonNotRunning when the daemon
        leaves the bus, BusUnreachable when the connection drops; call again to resume."""
        await self.connect()
        wake = asyncio.Event()
        gone: list[str] = []

        def on_signal(member: str, body: list[Any]) -> None:
            if member == "NameOwnerChanged" and not body[2]:
                gone.append("daemon")
            elif member == "Disconnected":
                gone.append("bus")
            elif member != "SnapshotUpdated":
                return
            wake.set()

        self._listeners.add(on_signal)
        try:
            yield await self.get_snapshot()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), poll_s)
                wake.clear()
                if "bus" in gone:
                    raise errors.BusUnreachable(self.bus, "connection lost")
                if gone:
                    raise errors.DaemonNotRunning(self.bus)
                yield await self.get_snapshot()
        finally:
            self._listeners.discard(on_signal)

    async def events(self, maxsize: int = 1000) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(kind, event)`` for each ``Event`` signal (kind: decision, drift, fault, hotplug, ...), across
        daemon restarts; the oldest are dropped when the consumer falls ``maxsize`` behind. Raises
        BusUnreachable when the connection drops."""
        await self.connect()
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue(maxsize)

        def on_signal(member: str, body: list[Any]) -> None:
            if member == "Event":
                try:
                    data = json.loads(body[1])
                except (TypeError, ValueError, IndexError):
                    data = {"message": str(body[1:])}
                item: tuple[str, dict[str, Any]] | None = (str(body[0]), data if isinstance(data, dict)
                                                            else {"message": str(data)})
            elif member == "Disconnected":
                item = None
            else:
                return
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(item)

        self._listeners.add(on_signal)
        try:
            while (item := await queue.get()) is not None:
                yield item
            raise errors.BusUnreachable(self.bus, "connection lost")
        finally:
            self._listeners.discard(on_signal)


async def describe_owners(client: Any, holds: Iterable[dict], known: dict | None = None) -> None:
    """Give each hold held by a connection an ``owner_text`` ("alice: python3 (pid 4242)", not ":1.42");
    ``known`` caches answers across calls (the TUI's)."""
    describe = getattr(client, "describe_owner", None)
    if describe is None:  # a client without it (a test's)
        return
    cache = {} if known is None else known
    for hold in holds:
        owner = str(hold.get("owner") or "")
        if hold.get("detached") or not owner.startswith(":"):
            continue
        if owner not in cache:
            cache[owner] = await describe(owner)
        if cache[owner]:
            hold["owner_text"] = cache[owner]
