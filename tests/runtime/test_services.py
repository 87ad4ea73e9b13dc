"""D-Bus and Prometheus services: started when they can be, a warning when not; stopped in reverse."""

from __future__ import annotations

import urllib.request

from structlog.testing import capture_logs

from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


async def test_an_unreachable_bus_and_a_taken_port_are_warnings(settings, clock, tmp_path):
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    s = settings.replace(**{"bus": f"unix:path={tmp_path}/no-bus",
                                    "metrics_listen": f"127.0.0.1:{port}"})
    d = Daemon(s, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE)
    try:
        with capture_logs() as logs:
            assert await d.run(max_ticks=2) == 0
    finally:
        taken.close()
    events = {e["event"] for e in logs}
    assert {"dbus_unavailable", "metrics_unavailable"} <= events
    assert d.hub.latest.seq == 2


def scrape_of(d: Daemon) -> tuple:
    """(the running daemon's metrics handle, one scrape of its /metrics over HTTP)."""
    handle = d.services.get("metrics").handle
    host, port = handle.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        return handle, r.read().decode()


async def test_metrics_are_served_from_the_published_snapshot_and_stopped(settings, clock):
    s = settings.replace(**{"metrics_listen": "127.0.0.1:0"})
    d = Daemon(s, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE)
    scraped = []

    def scrape():
        scraped.append(scrape_of(d)[1])
        return True

    await d.run(max_ticks=3, until=scrape)
    assert "aithermd_tick_duration_seconds_count 1.0" in scraped[0]
    assert d.services.started == []  # stopped


async def test_a_missing_service_module_is_a_warning(settings, clock, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "aithermd.publish.dbus_service", None)  # import raises ImportError
    s = settings.replace(**{"bus": "session"})
    d = Daemon(s, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE)
    with capture_logs() as logs:
        assert await d.run(max_ticks=1) == 0
    warn = [e for e in logs if e["event"] == "service_unavailable"]
    assert warn and warn[0]["module"] == "aithermd.publish.dbus_service"


async def test_a_bus_that_is_not_there_at_start_is_joined_when_it_comes(settings, clock):
    import asyncio

    from tests.support.dbus import PrivateBus

    bus = PrivateBus.start("session")
    bus.kill()  # not up yet when the daemon starts (dbus.service late, or restarting)
    d = Daemon(settings.replace(**{"bus": bus.address}), clock=clock, backends=[FakeBackend()],
               sleep=clock.sleep, engine=STUB_ENGINE)
    started = []

    async def later():
        await asyncio.sleep(0.5)
        bus.restart()

    def step():
        if not started:
            started.append(asyncio.get_running_loop().create_task(later()))
        service = d.services.get("dbus")
        return service is not None and service.connected

    try:
        with capture_logs() as logs:
            assert await asyncio.wait_for(d.run(until=step), 60) == 0
    finally:
        bus.stop()
    assert [e["event"] for e in logs if e["event"].startswith("dbus_")][:1] == ["dbus_unavailable"]
    assert d.hub.status["dbus"]["connected"] is False  # stopped: the name released


async def test_the_exporter_is_built_after_ready_and_counts_from_the_first_tick(settings, clock, monkeypatch):
    """issue 22, start-up: prometheus_client is imported after READY=1, and the exporter then holds what it
    would have held had it started first: the first tick's duration and its counters (every knob's drift
    counter at 0, from the first snapshot's devices), the first tick's publish replayed into its listeners."""
    from aithermd.runtime import sd_notify, services

    order: list[str] = []
    real_import = services.import_service
    monkeypatch.setattr(services, "import_service", lambda m: order.append(m) or real_import(m))
    real_ready = sd_notify.Notifier.ready
    monkeypatch.setattr(sd_notify.Notifier, "ready",
                        lambda self, *a: order.append("READY=1") or real_ready(self, *a))
    s = settings.replace(**{"metrics_listen": "127.0.0.1:0"})
    d = Daemon(s, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE)
    seen = []

    def after_first():
        handle, text = scrape_of(d)
        seen.append((dict(handle.counters.drift), text))
        return True

    await d.run(max_ticks=3, until=after_first)
    assert order == ["READY=1", "aithermd.publish.metrics"]
    drift, body = seen[0]
    knobs = {k.id for dev in d.hub.latest.devices for k in dev.knobs}
    assert knobs and drift == dict.fromkeys(knobs, 0)
    assert "aithermd_tick_duration_seconds_count 1.0" in body


async def test_an_exporter_stopped_before_the_first_tick_keeps_nothing(clock):
    import socket

    from aithermd.publish.hub import StateHub
    from aithermd.runtime.services import MetricsService

    hub = StateHub()
    service = MetricsService("127.0.0.1:0", hub, None)
    await service.start()
    port = service._sock.getsockname()[1]
    service.after_tick(0.01)
    await service.stop()
    assert service.handle is None
    assert hub._listeners == []  # the early keeper is detached: nothing grows for a service that is gone
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # the port is let go


async def test_a_scraper_that_connects_before_the_exporter_is_built_waits_for_its_answer():
    import socket

    from aithermd.publish.hub import StateHub
    from aithermd.runtime.services import MetricsService

    service = MetricsService("127.0.0.1:0", StateHub(), None)
    await service.start()  # the port is taken before the first tick
    conn = socket.create_connection(service._sock.getsockname()[:2], timeout=10)  # in the backlog
    try:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        service.after_tick(0.02)
        await service.start_late()
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    finally:
        conn.close()
        await service.stop()
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert b"aithermd_tick_duration_seconds_count 1.0" in answer


def test_aithermd_run_starts_with_the_collector_off_and_turns_it_on_again(monkeypatch):
    """issue 22, start-up: ``aithermd run`` imports and discovers with gc off (no cyclic-garbage passes over
    what start-up builds); on again if the command returns before the daemon's first tick."""
    import gc

    from aithermd import cli
    from aithermd.commands import run

    seen = []
    monkeypatch.setattr(run, "run", lambda args: seen.append(gc.isenabled()) or 0)
    assert gc.isenabled()
    assert cli.main(["run"]) == 0
    assert seen == [False] and gc.isenabled()


async def test_the_daemon_turns_the_collector_on_after_its_first_tick(settings, clock):
    import gc

    seen = []
    d = Daemon(settings, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE,
               before_sample=lambda t: seen.append(gc.isenabled()))
    gc.disable()
    try:
        assert await d.run(max_ticks=3) == 0
        assert seen == [False, True, True] and gc.isenabled()
    finally:
        gc.enable()
