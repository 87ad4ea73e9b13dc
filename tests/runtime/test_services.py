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


async def test_metrics_are_served_from_the_published_snapshot_and_stopped(settings, clock):
    s = settings.replace(**{"metrics_listen": "127.0.0.1:0"})
    d = Daemon(s, clock=clock, backends=[FakeBackend()], sleep=clock.sleep, engine=STUB_ENGINE)
    scraped = []

    def scrape():
        handle = d.services.get("metrics").handle
        host, port = handle.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            scraped.append(r.read().decode())
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
