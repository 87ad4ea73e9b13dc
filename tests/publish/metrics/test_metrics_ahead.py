"""A scrape's render made ahead, after the tick before it (:class:`aithermd.publish.scrape.Ahead`).

Fake clock."""

from __future__ import annotations

from prometheus_client import generate_latest

from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot
from aithermd.publish.scrape import Ahead, Exposition
from aithermd.publish.textfam import go_float


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def steady(exposition: bytes) -> bytes:
    """Without process_*: generate_latest reads the process anew."""
    return b"".join(line for line in exposition.splitlines(keepends=True)
                    if not line.startswith((b"process_", b"# HELP process_", b"# TYPE process_")))


def ticks_due(ahead: Ahead, clock: Clock, ticks: range) -> list[int]:
    out = []
    for t in ticks:
        clock.t = float(t)
        if ahead.due():
            out.append(t)
    return out


def test_the_render_is_due_after_the_tick_before_each_expected_scrape_and_only_then():
    clock = Clock()
    ahead = Ahead(clock)
    exposition = Exposition(type("Registry", (), {"register": lambda self, c: None})())
    scrapes = {10.3, 25.3, 40.3}  # Prometheus every 15 s at its own offset, then it stops
    due = []
    for t in range(0, 90):  # ticks every second, the scrapes between them
        clock.t = float(t)
        if ahead.due():
            due.append(t)
        if t + 0.3 in scrapes:
            clock.t = t + 0.3
            ahead.scrape(exposition)
    # never before two scrapes; then the tick before each expected scrape (25.3 was expected after the
    # first two), and with no scrape at 55.3 the tick at 56 too (late by less than a period), then nothing
    assert due == [40, 55, 56]


def test_scraped_faster_than_the_ticks_each_tick_is_rendered_ahead():
    clock = Clock()
    ahead = Ahead(clock)
    exposition = Exposition(type("Registry", (), {"register": lambda self, c: None})())
    for i in range(4):
        clock.t = 0.5 * i + 0.1
        ahead.scrape(exposition)
    assert ticks_due(ahead, clock, range(2, 3)) == [2]
    for t in range(3, 8):
        clock.t = t - 0.4
        ahead.scrape(exposition)
        clock.t = t - 0.1
        ahead.scrape(exposition)
        assert ticks_due(ahead, clock, range(t, t + 1)) == [t]


def test_a_steady_scraper_finds_the_latest_tick_rendered_and_renders_nothing():
    clock = Clock()
    hub = StateHub()
    handle = metrics.start("none", hub)
    handle.ahead = ahead = Ahead(clock)
    try:
        def tick(seq: int) -> None:
            clock.t = float(seq)
            hub.publish(reference_snapshot(seq, gpus=2))
            handle.observe_tick(0.0004 * seq)

        def scrape(at: float) -> bytes:
            clock.t = at
            return ahead.scrape(handle.exposition)

        tick(1)
        scrape(1.3)
        for seq in range(2, 7):
            tick(seq)
        assert ahead.ahead == 0  # one scrape: no rhythm yet
        scrape(6.3)
        for seq in range(7, 11):
            tick(seq)
        assert ahead.ahead == 0
        tick(11)  # the scrape expected at 11.3 comes before the next tick: rendered now
        assert ahead.ahead == 1
        before = handle.exposition.renders
        text = scrape(11.3)
        assert handle.exposition.renders == before  # nothing left to render: not even process_*
        assert steady(text) == steady(generate_latest(handle.registry))  # the latest tick, every family
        stamp = go_float(reference_snapshot(11, gpus=2).t_wall)
        assert f"aithermd_snapshot_timestamp_seconds {stamp}\n".encode() in text
        assert b"aithermd_tick_duration_seconds_count 11.0" in text
        for seq in range(12, 17):
            tick(seq)
        assert ahead.ahead == 2
        # a snapshot published after the render made ahead (no tick observed yet) is still what is served
        hub.publish(reference_snapshot(17, gpus=2))
        before = handle.exposition.renders
        text = scrape(16.3)
        assert handle.exposition.renders > before
        assert steady(text) == steady(generate_latest(handle.registry))
        stamp = go_float(reference_snapshot(17, gpus=2).t_wall)
        assert f"aithermd_snapshot_timestamp_seconds {stamp}\n".encode() in text
    finally:
        handle.stop()


def test_the_tick_never_waits_for_a_scrape_that_is_rendering():
    clock = Clock()
    hub = StateHub()
    handle = metrics.start("none", hub)
    handle.ahead = ahead = Ahead(clock)
    try:
        hub.publish(reference_snapshot(1))
        for t in (0.3, 1.3):
            clock.t = t
            ahead.scrape(handle.exposition)
        before = handle.exposition.renders
        with ahead._lock:  # a scrape rendering on the scrape thread
            clock.t = 2.0
            hub.publish(reference_snapshot(2))
            handle.observe_tick(0.001)  # due, but not waited for
        assert ahead.ahead == 0 and handle.exposition.renders == before
        clock.t = 2.3
        assert steady(ahead.scrape(handle.exposition)) == steady(generate_latest(handle.registry))
    finally:
        handle.stop()
