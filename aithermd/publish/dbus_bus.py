"""The daemon's D-Bus connection: connecting, surviving a full socket, and knowing who is calling.

Three things dbus-fast 5.2.0 does not give us:

- **EAGAIN on a full socket.** ``dbus_fast.aio.message_bus._MessageWriter`` writes a message at once when its
  queue is empty; on a non-blocking socket whose send buffer is full, ``socket.send`` raises
  ``BlockingIOError`` and the writer *finalizes the bus* (upstream: python-dbus-next issue #153, still open
  in dbus-fast). :class:`_NonBlockingSend` wraps the writer's socket so EAGAIN reads as "0 bytes written":
  the writer keeps the message, registers for writability and finishes it when the socket drains.
- **The caller of a high-level method.** ``ServiceInterface`` methods do not see the message. A message
  handler on the bus (user handlers run before the exported methods, in the same callback) records the
  current call in a :class:`~contextvars.ContextVar`; a synchronous method reads it directly, a coroutine
  method reads it from the context its task copied at creation. See :meth:`CallTracker.sender`.
- **In-flight calls per connection.** A call counts from its arrival until its reply is *written to the
  socket* (so a client that does not read cannot make us buffer without bound); over the cap the caller
  gets ``io.github.aithermd.Error.Busy`` at once.
- **Fairness to the tick.** dbus-fast's reader handles every message already in its buffer in one event-loop
  callback: hundreds of queued ``GetSnapshot`` calls (each marshalling a ~24 kB reply) held the loop for
  60–160 ms. :class:`DaemonBus` queues incoming messages and handles them in slices of at most
  :data:`SLICE_S`, in arrival order, so a timer (the tick, the fast lane) waits at most one slice.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import socket
import time
from collections.abc import Callable

from dbus_fast import BusType, Message, MessageFlag, MessageType
from dbus_fast.aio import MessageBus

from aithermd.errors import AithermError
from aithermd.publish import wire

DEFAULT_MAX_IN_FLIGHT = 128
SLICE_S = 0.002  # longest run of incoming messages handled before the event loop gets a turn
_NAME_OWNER_CHANGED_RULE = ("type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
                            "member='NameOwnerChanged',path='/org/freedesktop/DBus'")


class BusUnavailable(AithermError):
    """The bus cannot be reached, refused us, or our name is taken; the daemon runs on without D-Bus."""


class _NonBlockingSend:
    """The writer's view of the socket: ``send`` answers 0 instead of raising EAGAIN/EINTR.

    dbus-fast's writer then treats the message as partly written and waits for writability (its own path for
    short writes). ``sendmsg`` (unix fds, never negotiated by the daemon) passes through unchanged.
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, data: memoryview) -> int:
        try:
            return self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0

    def sendmsg(self, *args: object) -> int:
        return self._sock.sendmsg(*args)  # type: ignore[arg-type]

    def fileno(self) -> int:
        return self._sock.fileno()


class DaemonBus(MessageBus):
    """:class:`dbus_fast.aio.MessageBus` whose replies report when they reach the socket, and whose incoming
    messages are handled in time slices (module docstring, "Fairness to the tick").

    ``reply_written(destination, reply_serial)`` (set by :class:`CallTracker`) is called once each method
    return or error leaves the writer (or the connection ends).
    """

    reply_written: Callable[[str, int], None] | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._inbox: collections.deque[Message] = collections.deque()
        self._draining = False

    def _process_message(self, msg: Message) -> None:
        """The reader's hand-off: queue ``msg``; :meth:`_drain` handles it on a later loop turn."""
        self._inbox.append(msg)
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Handle queued messages in order for at most :data:`SLICE_S`, then yield to the loop."""
        inbox, handle = self._inbox, super()._process_message
        deadline = time.perf_counter() + SLICE_S
        try:
            while inbox:
                try:
                    handle(inbox.popleft())
                except Exception:  # as dbus-fast's own reader does: one bad message never stops the rest
                    logging.getLogger(__name__).exception("error handling a D-Bus message")
                if time.perf_counter() >= deadline:
                    break
        finally:
            if inbox:
                asyncio.get_running_loop().call_soon(self._drain)
            else:
                self._draining = False

    def send(self, msg: Message) -> asyncio.Future:
        """Queue ``msg``; the future resolves once it is written. dbus-fast writes at once when its queue is
        empty: a write the bus's death cut short (BrokenPipeError) then finalized the bus inside the caller,
        in the middle of dbus-fast's own loop over a signal's buses ("Set changed size during iteration"
        raised into the hub). Here the write always happens from the loop, and a failed one counts as seen:
        the disconnect itself is what the daemon acts on (``dbus_lost``, then a new connection), and signals
        and replies are sent without awaiting, so asyncio would log "Future exception was never retrieved"
        when the old connection is collected."""
        if not msg.serial:
            msg.serial = self.next_serial()
        future = self._loop.create_future()
        future.add_done_callback(_seen)
        writer = self._writer
        try:  # queued, and written from the loop: never inside the caller (a signal's emission)
            writer.buffer_message(msg, future)
            if self.unique_name:  # before Hello's answer dbus-fast schedules the queue itself
                self._loop.add_writer(writer.fd, writer.write_callback)
        except (OSError, ValueError) as exc:  # the socket is closed already
            if not future.done():
                future.set_exception(exc)
        hook = self.reply_written
        if hook is not None and msg.reply_serial and msg.destination and msg.message_type in (
                MessageType.METHOD_RETURN, MessageType.ERROR):
            dest, serial = msg.destination, msg.reply_serial
            future.add_done_callback(lambda _f: hook(dest, serial))
        return future


def _seen(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def connect(bus: str, *, timeout_s: float = 5.0) -> DaemonBus:
    """Connect to ``bus`` (``"system"``, ``"session"`` or a D-Bus address such as ``unix:path=/run/x``).

    Raises :class:`BusUnavailable` with the reason when it cannot be reached in ``timeout_s``.
    """
    kind = {"system": BusType.SYSTEM, "session": BusType.SESSION}.get(bus)
    try:
        conn = DaemonBus(bus_type=kind) if kind is not None else DaemonBus(bus_address=bus)
        await asyncio.wait_for(conn.connect(), timeout_s)
    except Exception as exc:  # OSError, AuthError, InvalidAddressError, TimeoutError, missing env var...
        raise BusUnavailable(f"cannot connect to the {bus} bus: {type(exc).__name__}: {exc}") from exc
    writer = conn._writer  # noqa: SLF001 - the documented workaround for the EAGAIN bug (module docstring)
    if writer is not None and not isinstance(writer.sock, _NonBlockingSend):
        writer.sock = _NonBlockingSend(writer.sock)
    return conn


def bus_daemon_message(member: str, signature: str = "", body: list | None = None) -> Message:
    """A method call to the bus daemon itself (``org.freedesktop.DBus``, D-Bus specification)."""
    return Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                   interface="org.freedesktop.DBus", member=member, signature=signature, body=body or [])


class CallTracker:
    """Per-connection accounting of calls to ``path``; see the module docstring.

    ``sender()`` is the unique name of the caller of the method now running (raises RuntimeError outside a
    call). ``on_vanished(callback)`` registers ``callback(unique_name)`` for every unique name that leaves
    the bus. Install with :meth:`install`, remove with :meth:`uninstall`.
    """

    def __init__(self, bus: DaemonBus, path: str = wire.OBJECT_PATH, interface: str = wire.INTERFACE,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self._bus = bus
        self._path = path
        self._interface = interface
        self.max_in_flight = max_in_flight
        self._current: contextvars.ContextVar[Message | None] = contextvars.ContextVar("aithermd_call",
                                                                                      default=None)
        self._in_flight: dict[str, set[int]] = {}
        self._vanished: list[Callable[[str], None]] = []

    async def install(self) -> None:
        self._bus.add_message_handler(self._on_message)
        self._bus.reply_written = self._on_reply_written
        reply = await self._bus.call(bus_daemon_message("AddMatch", "s", [_NAME_OWNER_CHANGED_RULE]))
        if reply.message_type is MessageType.ERROR:
            raise BusUnavailable(f"AddMatch NameOwnerChanged refused: {reply.error_name}: {reply.body}")

    def uninstall(self) -> None:
        self._bus.remove_message_handler(self._on_message)
        self._bus.reply_written = None

    def on_vanished(self, callback: Callable[[str], None]) -> None:
        self._vanished.append(callback)

    def sender(self) -> str:
        msg = self._current.get()
        if msg is None or not msg.sender:
            raise RuntimeError("no D-Bus call in progress")
        return msg.sender

    def interactive(self) -> bool:
        """Whether the method now running may wait on a password prompt: its message's header flag
        ``ALLOW_INTERACTIVE_AUTHORIZATION`` (D-Bus specification). False outside a call."""
        msg = self._current.get()
        return msg is not None and bool(msg.flags & MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION)

    def in_flight(self, sender: str) -> int:
        return len(self._in_flight.get(sender, ()))

    def _on_message(self, msg: Message) -> Message | bool | None:
        if msg.message_type is MessageType.SIGNAL:
            if msg.member == "NameOwnerChanged" and msg.sender == "org.freedesktop.DBus":
                self._name_owner_changed(msg)
            return None
        if (msg.message_type is not MessageType.METHOD_CALL or msg.path != self._path
                or msg.interface not in (self._interface, None) or not msg.sender):
            return None
        self._current.set(msg)
        if msg.flags & MessageFlag.NO_REPLY_EXPECTED:
            return None  # no reply will ever be written: nothing to count
        calls = self._in_flight.setdefault(msg.sender, set())
        if len(calls) >= self.max_in_flight:
            return Message.new_error(msg, wire.ERROR_BUSY,
                                     f"more than {self.max_in_flight} calls in flight on this connection")
        calls.add(msg.serial)
        return None  # let the exported ServiceInterface method handle it

    def _on_reply_written(self, destination: str, reply_serial: int) -> None:
        calls = self._in_flight.get(destination)
        if calls is not None:
            calls.discard(reply_serial)
            if not calls:
                del self._in_flight[destination]

    def _name_owner_changed(self, msg: Message) -> None:
        name, _old, new = msg.body
        if not name.startswith(":") or new:
            return
        self._in_flight.pop(name, None)
        for callback in tuple(self._vanished):
            callback(name)
