"""The scrape's own text (aithermd.publish.textfam) against prometheus-client's: the tick histogram, the
process figures, and the text kept while a collector's inputs are equal."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import Histogram, ProcessCollector
from prometheus_client.utils import floatToGoString

from aithermd.model import Alarm
from aithermd.publish import metrics
from aithermd.publish.hub import StateHub
from aithermd.publish.reference import reference_snapshot
from aithermd.publish.scrape import exposition
from aithermd.publish.textfam import ProcessFigures, TickHistogram, go_float


def _without_created(text: bytes) -> list[bytes]:
    return [line for line in text.splitlines() if b"_created" not in line]


def test_the_tick_histogram_is_prometheus_clients_histogram():
    ours = TickHistogram("t_seconds", "A tick.", metrics.TICK_BUCKETS_S)
    theirs = Histogram("t_seconds", "A tick.", buckets=metrics.TICK_BUCKETS_S, registry=None)
    for value in (0.0001, 0.0005, 0.0007, 0.001, 0.003, 2.5, 7.0, 0.0):
        ours.observe(value)
        theirs.observe(value)
        assert _without_created(ours.text()) == _without_created(exposition(theirs.collect()))
        assert ours.text() == exposition(ours.collect())


def test_process_figures_are_prometheus_clients_families():
    ours, theirs = ProcessFigures(), ProcessCollector(registry=None)
    mine, base = ours.text().decode().splitlines(), exposition(theirs.collect()).decode().splitlines()
    assert [line for line in mine if line.startswith("#")] == [line for line in base if line.startswith("#")]
    values = {line.split()[0]: line.split()[1] for line in mine if not line.startswith("#")}
    expected = {line.split()[0]: line.split()[1] for line in base if not line.startswith("#")}
    assert values.keys() == expected.keys()
    for name in ("process_start_time_seconds", "process_max_fds"):
        assert values[name] == expected[name]
    assert float(values["process_cpu_seconds_total"]) <= float(expected["process_cpu_seconds_total"]) + 0.05


def test_go_float_is_float_to_go_string():
    for v in (0.0, -0.0, 1.0, 0.1, 1e-9, 123456.5, 1234567.0, 1e7, -1e7, 1.7962057820147657e9, 1e22, -3.5,
              float("inf"), float("-inf"), float("nan"), 42, 2**60):
        assert go_float(v) == floatToGoString(v), v


def test_text_kept_while_inputs_are_equal_and_rendered_again_when_they_change():
    hub = StateHub()
    handle = metrics.start("none", hub)
    try:
        hub.publish(reference_snapshot(1, gpus=2))
        metrics.render(handle)
        before = handle.exposition.renders
        # a new tick with new readings, its alarms, health and budget made anew but equal: the GPU, hwmon and
        # RAPL readings, the time and the process figures are rendered again (and the decision counters: the
        # GPU fans' duties moved); fans, health, policy and budget are kept
        hub.publish(reference_snapshot(2, gpus=2))
        metrics.render(handle)
        assert handle.exposition.renders - before == 6
        fan = "hwmon:nct6798-isa-0290/fan2"
        stalled = replace(reference_snapshot(3, gpus=2), alarms={fan: Alarm("stalled", "no speed", 1.0)},
                          degraded=(fan,))
        hub.publish(stalled)
        text = metrics.render(handle).decode()
        assert 'aithermd_fan_stalled{chip="nct6798-isa-0290",label="CPU fan",node_chip="nct6798",' \
               'sensor="fan2"} 1.0' in text
        assert f'aithermd_degraded{{id="{fan}"}} 1.0' in text
        labels = '{chip="nct6798-isa-0290",label="CPU fan",node_chip="nct6798",sensor="fan2"}'
        assert f"aithermd_fan_tach_blind{labels} 0.0" in text  # there from the start, at 0
        blind = {fan: Alarm("blind", "no speed at 40 %", 1.0)}
        hub.publish(replace(reference_snapshot(4, gpus=2), alarms=blind))
        text = metrics.render(handle).decode()
        assert f"aithermd_fan_tach_blind{labels} 1.0" in text and f"aithermd_fan_stalled{labels} 0.0" in text
    finally:
        handle.stop()


def test_without_gpus_or_rapl_their_families_are_kept_as_headers():
    hub = StateHub()
    handle = metrics.start("none", hub)
    try:
        def bare(seq: int):
            snap = reference_snapshot(seq, gpus=0)
            return replace(snap, devices=tuple(d for d in snap.devices if not d.id.startswith("powercap:")))

        hub.publish(bare(1))
        first = metrics.render(handle)
        before = handle.exposition.renders
        hub.publish(bare(2))
        text = metrics.render(handle)
        assert handle.exposition.renders - before == 3  # hwmon readings, time, process_*
        assert b"# TYPE aithermd_gpu_power_watts gauge\n" in text and b"aithermd_gpu_power_watts{" not in text
        assert b"# TYPE aithermd_rapl_power_watts gauge\n" in text
        assert text != first
    finally:
        handle.stop()
