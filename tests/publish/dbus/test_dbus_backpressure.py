"""A full socket never kills the daemon's connection (dbus-fast 5.2.0 EAGAIN bug, worked around)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

from dbus_fast import Message
from dbus_fast.aio.message_bus import _MessageWriter
from dbus_helpers import HERE, ok

from aithermd.publish import dbus_service
from aithermd.publish.dbus_bus import DaemonBus, _NonBlockingSend
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot


class _WriterHost:
    """The attributes of a MessageBus that ``_MessageWriter`` uses."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self._negotiate_unix_fd = False
        self._sock, self._fd, self._loop = sock, sock.fileno(), loop
        self.unique_name = ":1.42"
        self._user_disconnect = False
        self.finalized: list[Exception | None] = []

    def _finalize(self, err: Exception | None) -> None:
        self.finalized.append(err)


def _full_socketpair() -> tuple[socket.socket, socket.socket]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    try:
        while True:
            ours.send(b"\0" * 65536)
    except BlockingIOError:
        pass
    return ours, peer


def _message() -> Message:
    return Message(destination="org.example", path="/", interface="org.example", member="Ping",
                   signature="s", body=["x" * 100_000], serial=7)


async def test_the_upstream_writer_dies_on_a_full_socket():
    """Documents the bug the workaround exists for; when this fails, dbus-fast fixed it upstream and
    ``_NonBlockingSend`` can go."""
    ours, peer = _full_socketpair()
    host = _WriterHost(ours, asyncio.get_running_loop())
    writer = _MessageWriter(host)
    writer.schedule_write(_message(), asyncio.get_running_loop().create_future())
    assert host.finalized and isinstance(host.finalized[0], BlockingIOError)
    ours.close()
    peer.close()


async def test_with_the_workaround_the_message_waits_for_the_socket_to_drain():
    loop = asyncio.get_running_loop()
    ours, peer = _full_socketpair()
    host = _WriterHost(ours, loop)
    writer = _MessageWriter(host)
    writer.sock = _NonBlockingSend(ours)
    sent = loop.create_future()
    writer.schedule_write(_message(), sent)
    assert host.finalized == [] and not sent.done()
    received = bytearray()

    def drain() -> None:
        peer.settimeout(5.0)
        while not received.endswith(b"x" * 100 + b"\0"):  # the body string ends the message
            received.extend(peer.recv(1 << 20))

    drainer = asyncio.ensure_future(asyncio.to_thread(drain))
    await asyncio.wait_for(sent, 10.0)
    await drainer
    assert host.finalized == []
    assert received.endswith(bytes(_message()._marshall(False)))
    loop.remove_writer(ours.fileno())
    ours.close()
    peer.close()


async def test_a_burst_of_messages_leaves_the_loop_a_turn_between_slices():
    """The reader hands over a whole buffer of calls at once; they are handled in arrival order, a slice at
    a time, so a tick due meanwhile runs after one slice, not after the whole burst."""
    bus = DaemonBus(bus_address="unix:path=/nonexistent")  # never connected: only its message handling
    handled: list[int] = []

    def slow_handler(msg: Message) -> bool:
        started = time.perf_counter()
        while time.perf_counter() - started < 0.001:  # 1 ms of work per message, 50 ms in all
            pass
        handled.append(msg.serial)
        return True  # handled here: no reply to send

    bus.add_message_handler(slow_handler)
    for serial in range(1, 51):  # as dbus-fast's reader does: one callback, many messages
        bus._process_message(Message(destination="org.example", path="/", interface="org.example",
                                      member="Ping", serial=serial))
    assert handled == []  # queued, not handled inside the reader's callback
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert 0 < len(handled) < 50  # one slice ran, then the loop had its turn
    for _ in range(200):
        if len(handled) == 50:
            break
        await asyncio.sleep(0)
    assert handled == list(range(1, 51))


async def test_ten_clients_with_64_calls_in_flight_each(bus_address, polkitd, control, client):
    """The service's connection survives and every call is answered while a loop beside it publishes a
    fresh document every tick. How late those ticks run under the load is a figure, measured in
    benchmarks/bench_dbus_load.py beside a quiet reference (a loaded CI machine says nothing about it)."""
    hub = StateHub()
    hub.publish(reference_snapshot(1, gpus=16))  # a ~24 kB document: 640 of them overflow any socket buffer
    handle = await dbus_service.start(bus_address, control, hub, snapshot_interval_s=0.0)
    rounds = 10
    tick_s = 0.25
    stop = asyncio.Event()

    async def ticker() -> None:
        seq = 1
        while not stop.is_set():
            await asyncio.sleep(tick_s)
            seq += 1
            hub.publish(reference_snapshot(seq, gpus=16, tick_s=tick_s))  # a fresh document every tick

    ticking = asyncio.ensure_future(ticker())
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "stress_clients.py"), bus_address, "10", "64", str(rounds),
            stdout=subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        result = json.loads(out)
        stop.set()
        await ticking
        assert result["ok"] == 10 * 64 * rounds and result["errors"] == {}
        assert result["min_len"] > 20_000
        assert handle.bus.connected
        (text,) = await ok(client, "GetSnapshot")  # still serving
        assert json.loads(text)["seq"] == hub.latest.seq
    finally:
        stop.set()
        ticking.cancel()
        await handle.stop()
