"""The systemd notify protocol against a datagram socket of the test's own."""

from __future__ import annotations

import os
import socket

import pytest

from aithermd.runtime.daemon import Daemon
from aithermd.runtime.sd_notify import Notifier
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield path, sock
    sock.close()


def drain(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_disabled_without_notify_socket():
    n = Notifier({})
    assert not n.enabled and not n.ready() and n.watchdog_interval_s is None


def test_watchdog_interval_is_half_watchdog_usec_and_checks_the_pid(notify_socket):
    path, _ = notify_socket
    n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_interval_s == 2.0
    other = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None


def test_abstract_socket_address():
    name = f"aithermd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready("up")
        assert sock.recv(100) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()


def test_status_is_sent_only_when_it_changes(notify_socket):
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": str(path)})
    assert n.status("a") and not n.status("a") and n.status("b")
    assert drain(sock) == ["STATUS=a", "STATUS=b"]


def test_a_vanished_socket_is_a_warning_not_an_error(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled and not n.ready()


async def test_ready_after_the_first_tick_then_status_and_stopping(settings, clock, notify_socket):
    path, sock = notify_socket
    env = {"NOTIFY_SOCKET": str(path)}
    d = Daemon(settings, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE,
               environ=env)
    before_first = []
    d.before_sample = lambda t: before_first.append(drain(sock)) if not before_first else None

    def operate():
        if d.hub.latest.seq == 1:
            d.control.set_active_policy("handsoff")
        return False

    assert await d.run(max_ticks=3, until=operate) == 0
    assert before_first == [[]]  # nothing before the first tick
    messages = drain(sock)
    assert messages[0] == "READY=1\nSTATUS=policy balanced, 2 knobs controlled, 0 degraded"
    assert messages[1] == "STATUS=policy handsoff, 0 knobs controlled, 0 degraded"
    assert messages[-1] == "STOPPING=1" and len(messages) == 3


async def test_watchdog_pings_while_ticks_complete(settings, notify_socket):
    import asyncio
    path, sock = notify_socket
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "100000"}  # ping every 50 ms
    s = settings.replace(**{"tick_s": 0.1})
    d = Daemon(s, backends=[FakeBackend()], engine=STUB_ENGINE, environ=env)
    task = asyncio.create_task(d.run())
    messages: list[str] = []
    for _ in range(200):  # waits for events, not for a duration: up to 10 s on a loaded machine
        await asyncio.sleep(0.05)
        messages += drain(sock)
        if messages.count("WATCHDOG=1") >= 3:
            break
    d.request_stop()
    assert await asyncio.wait_for(task, 10) == 0
    assert messages[0].startswith("READY=1")
    assert messages.count("WATCHDOG=1") >= 3


async def test_no_watchdog_ping_while_the_tick_hangs(settings, notify_socket):
    import asyncio
    path, sock = notify_socket
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "40000"}  # ping every 20 ms while healthy
    s = settings.replace(**{"tick_s": 0.05})
    backend = FakeBackend()
    hang = asyncio.Event()
    d = Daemon(s, backends=[backend], engine=STUB_ENGINE, environ=env)
    original = d._run_tick

    async def tick(seq, deadline):
        if seq == 2:
            await hang.wait()  # e.g. a hung NVML call awaited in the worker thread
        await original(seq, deadline)

    d._run_tick = tick  # type: ignore[method-assign]
    task = asyncio.create_task(d.run())
    messages: list[str] = []
    for _ in range(200):
        await asyncio.sleep(0.05)
        messages += drain(sock)
        if messages and messages[0].startswith("READY=1") and d.scheduler.seq >= 2:
            break
    await asyncio.sleep(0.3)  # tick_s + 2 × interval = 0.09 s: pings must have stopped by now
    drain(sock)
    await asyncio.sleep(0.2)
    assert "WATCHDOG=1" not in drain(sock)
    hang.set()
    d.request_stop()
    assert await asyncio.wait_for(task, 10) == 0


async def test_a_reload_is_framed_by_reloading_and_ready(settings, clock, notify_socket, policy_dir):
    """RELOADING=1 with MONOTONIC_USEC, then READY=1 when it is done, accepted or refused: what
    Type=notify-reload (systemd 253 and later) waits for."""
    import time

    path, sock = notify_socket
    d = Daemon(settings, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE,
               environ={"NOTIFY_SOCKET": str(path)})
    outcomes = []

    def operate():
        if d.hub.latest.seq == 1:
            drain(sock)
            d.reload_now()
            outcomes.append(drain(sock))
            (policy_dir / "broken.yaml").write_text("description: [x\n")
            with pytest.raises(Exception):  # noqa: B017 - PolicyErrors, logged
                d.reload_now()
            outcomes.append(drain(sock))
        return False

    assert await d.run(max_ticks=2, until=operate) == 0
    for messages in outcomes:
        assert len(messages) == 2 and messages[1] == "READY=1"
        reloading, stamp = messages[0].split("\n")
        assert reloading == "RELOADING=1" and stamp.startswith("MONOTONIC_USEC=")
        assert 0 <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - int(stamp.split("=")[1]) < 60e6
