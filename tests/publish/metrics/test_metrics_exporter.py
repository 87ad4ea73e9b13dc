"""The HTTP endpoint, listen addresses, and `promtool check metrics`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from dataclasses import replace

import pytest
from metrics_helpers import samples, value

from aithermd.model import Event, Hold, Layer
from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot


@pytest.mark.parametrize(("listen", "expected"), [
    ("127.0.0.1:8736", ("127.0.0.1", 8736)),
    ("[::1]:9", ("::1", 9)),
    (":8736", ("127.0.0.1", 8736)),
    ("none", None),
    ("NONE", None),
])
def test_parse_listen(listen, expected):
    assert metrics.parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["127.0.0.1", "host:port", "1.2.3.4:70000", "localhost:-1"])
def test_a_malformed_listen_address_is_a_value_error(listen):
    with pytest.raises(ValueError, match="HOST:PORT"):
        metrics.start(listen, StateHub())


def test_the_default_is_loopback_outside_the_prometheus_port_allocations():
    host, port = metrics.parse_listen(metrics.DEFAULT_METRICS_LISTEN)
    assert host == "127.0.0.1" and not 9090 <= port <= 9999


def test_serves_the_last_snapshot_over_http():
    hub = StateHub()
    handle = metrics.start("127.0.0.1:0", hub)
    try:
        hub.publish(reference_snapshot(5))
        host, port = handle.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert value(samples(text), "aithermd_gpu_energy_joules_total", gpu_index="1") == 1500.0
    finally:
        handle.stop()
    handle.stop()  # idempotent
    with pytest.raises(OSError):
        with socket.create_connection((host, port), timeout=1):
            pass


def test_a_port_in_use_is_an_oserror():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            metrics.start(f"127.0.0.1:{taken.getsockname()[1]}", StateHub())


def _busy_exposition() -> bytes:
    """Every metric family populated: holds, drift, faults, failsafe, degraded, ticks."""
    hub = StateHub()
    handle = metrics.start("none", hub)
    hub.publish(reference_snapshot(1))
    snap = reference_snapshot(2, holds=(Hold(1, "quiet", "x", ":1.2"),))
    decisions = dict(snap.decisions)
    decisions["gpu0/fan0"] = replace(decisions["gpu0/fan0"], layer=Layer.SAFETY, rule="safety/hot")
    hub.publish(replace(snap, decisions=decisions, degraded=("gpu1",)),
                [Event("drift", 1.0, "gpu0/fan0", "x"), Event("fault", 1.0, "gpu1", "lost")])
    handle.observe_tick(0.002)
    return metrics.render(handle)


def test_promtool_check_metrics_passes():
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (scripts/system-packages.txt: prometheus)")
    done = subprocess.run(["promtool", "check", "metrics"], input=_busy_exposition(), capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert done.stdout.strip() == b"" and done.stderr.strip() == b""  # not even a lint warning


def steady(exposition: bytes) -> bytes:
    """The exposition without the process_* families, whose values change from one read to the next."""
    return b"".join(line for line in exposition.splitlines(keepends=True)
                    if not line.startswith((b"process_", b"# HELP process_", b"# TYPE process_")))


def test_the_cached_exposition_is_byte_for_byte_prometheus_clients():
    from prometheus_client import generate_latest

    from aithermd.model import Event
    from aithermd.publish.reference import reference_snapshot

    hub = StateHub()
    handle = metrics.start("none", hub)
    try:
        for seq in range(1, 6):
            snap = reference_snapshot(seq, gpus=2)
            hub.publish(snap, [Event("fault", snap.t_wall, "gpu1/temperature", 'a "quoted"\\ fault\n', {})])
            handle.observe_tick(0.0004 * seq)
            # twice: cached prefixes too (process_*: generate_latest reads the process anew: left out)
            assert steady(metrics.render(handle)) == steady(generate_latest(handle.registry))
            assert steady(metrics.render(handle)) == steady(generate_latest(handle.registry))
    finally:
        handle.stop()


def test_http_answers_only_get_and_head_of_metrics():
    hub = StateHub()
    handle = metrics.start("127.0.0.1:0", hub)
    host, port = handle.address
    try:
        def ask(request: bytes) -> bytes:
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(request)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            return out

        assert ask(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404")
        assert ask(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405")
        head = ask(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
        assert b"aithermd_build_info" in ask(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        # / is a landing page that links to the metrics, as exporters have; not the metrics themselves
        landing = ask(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert landing.startswith(b"HTTP/1.1 200") and b"Content-Type: text/html" in landing
        assert b'<a href="/metrics">' in landing and b"aithermd_build_info" not in landing
        assert ask(b"GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404")
    finally:
        handle.stop()
        handle.stop()  # twice is fine


def test_a_second_scrape_within_a_tick_renders_only_what_changes_at_every_scrape():
    """Two scrapes of the same snapshot: the second renders nothing (``process_*`` are read once a tick), and
    gives the same text (Prometheus pairs, Grafana Agent and aithermctl may all scrape within one tick); a
    new snapshot, a tick observed, a service's status replaced, are seen at the next scrape."""
    from prometheus_client import generate_latest

    from aithermd.publish.reference import reference_snapshot

    hub = StateHub()
    handle = metrics.start("none", hub)
    try:
        hub.publish(reference_snapshot(1, gpus=2))
        first = metrics.render(handle)
        before = handle.exposition.renders
        assert metrics.render(handle) == first
        assert handle.exposition.renders - before == 0
        for n in (1, 2):  # the same duration twice: each observation is seen, and process_* read again
            handle.observe_tick(0.003)
            before = handle.exposition.renders
            assert f"aithermd_tick_duration_seconds_count {n}.0".encode() in metrics.render(handle)
            assert handle.exposition.renders - before == 2  # the histogram and process_*
        hub.status["dbus"] = {"connected": True, "reconnects": 3}
        text = metrics.render(handle)
        assert b"aithermd_dbus_reconnects_total 3.0" in text
        hub.publish(reference_snapshot(2, gpus=2))
        assert steady(metrics.render(handle)) == steady(generate_latest(handle.registry))
        assert steady(metrics.render(handle)) != steady(text)  # the new snapshot's values
    finally:
        handle.stop()
