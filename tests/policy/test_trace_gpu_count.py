"""Traces without an index column: the number of GPUs whatever the timing of their rows.

The multi-GPU logs here are built from the real Windows training trace: GPU g replays the real rows from
``g × 397`` samples in, so each GPU's readings move as a real card's do and the GPUs differ; the timing is
what real loggers produce (rows of one sample read tenths of a second apart, samples arriving irregularly,
some less than a second after the previous one, whole-second stamps with several samples a second).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aithermd.policy.trace import parse_trace, read_trace_text

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
WINDOWS = TRACES / "windows-training-padded-10min-idle.csv"
HEADER = ("timestamp, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], "
          "memory.used [MiB], utilization.gpu [%], pstate")


def real_rows() -> list[str]:
    lines = read_trace_text(WINDOWS).splitlines()[1:]
    return [line.split(", ", 1)[1] for line in lines]  # everything after the timestamp


def stamp(t: float, ms: bool) -> str:
    whole, frac = divmod(int(round(t * 1000)), 1000)
    h, m, s = 10 + whole // 3600, (whole // 60) % 60, whole % 60
    text = f"2026/06/11 {h:02d}:{m:02d}:{s:02d}"
    return text + (f".{frac:03d}" if ms else "")


def build(n_gpus: int, samples: int, times, row_gap, ms: bool = True, identical: bool = False) -> str:
    rows = real_rows()
    out = [HEADER]
    for k in range(samples):
        t0 = times(k)
        for g in range(n_gpus):
            src = rows[(k + (0 if identical else 397 * g)) % len(rows)]
            out.append(f"{stamp(t0 + g * row_gap(k, g), ms)}, {src}")
    return "\n".join(out) + "\n"


def count(text: str) -> int:
    trace = parse_trace(text)
    return len(trace.gpu_ids)


def test_rows_of_one_sample_tenths_of_a_second_apart():
    rng = random.Random(1)
    gaps = [rng.uniform(0.1, 0.25) for _ in range(300)]
    text = build(4, 300, lambda k: 100 + 1.3 * k, lambda k, g: gaps[k])
    trace = parse_trace(text)
    assert len(trace.gpu_ids) == 4 and len(trace.samples) == 300
    assert trace.period_s == pytest.approx(1.3, abs=0.05)


def test_samples_arriving_less_than_a_second_apart():
    """The 4-GPU log the old time-threshold grouping read as 8 GPUs: rows of a sample a few ms apart,
    samples 0.55-1.45 s apart (a logger loop that sleeps 1 s around a query of varying length)."""
    rng = random.Random(2)
    starts = [100.0]
    for _ in range(299):
        starts.append(starts[-1] + rng.uniform(0.55, 1.45))
    text = build(4, 300, lambda k: starts[k], lambda k, g: 0.004)
    trace = parse_trace(text)
    assert len(trace.gpu_ids) == 4 and len(trace.samples) == 300
    assert [round(r.values["power.draw"], 2) for r in trace.samples[10].gpus] == [
        float(real_rows()[(10 + 397 * g)].split(",")[0].split()[0]) for g in range(4)]


def test_whole_second_stamps_with_two_samples_a_second():
    text = build(4, 300, lambda k: 100 + 0.5 * k, lambda k, g: 0.0, ms=False)
    assert count(text) == 4


@pytest.mark.parametrize("n_gpus", [1, 2, 3, 8])
def test_other_counts(n_gpus):
    rng = random.Random(n_gpus)
    text = build(n_gpus, 200, lambda k: 100 + k + rng.uniform(-0.3, 0.3), lambda k, g: 0.02)
    assert count(text) == n_gpus


def test_identical_gpus_are_counted_by_their_stamps():
    """Four cards reading alike (the same rows): the values cannot tell them apart, the gaps can."""
    text = build(4, 120, lambda k: 100 + k, lambda k, g: 0.0, identical=True)
    assert count(text) == 4


def test_the_recorded_single_gpu_traces_stay_single():
    for name in ("windows-training-padded-10min-idle.csv", "rtx4090-vlm-workload-padded-10min-idle.csv"):
        trace = parse_trace(read_trace_text(WINDOWS.parent / name))
        assert len(trace.gpu_ids) == 1
        assert trace.period_s == pytest.approx(1.0, abs=0.02)


def test_without_a_timestamp_column_the_values_count_the_gpus():
    rows = real_rows()
    lines = ["power.draw [W], temperature.gpu, memory.used [MiB], utilization.gpu [%]"]
    for k in range(200):
        for g in range(3):
            power, temp, _sm, _mem, used, util, _ps = rows[(k + 397 * g) % len(rows)].split(", ")
            lines.append(f"{power}, {temp}, {used}, {util}")
    assert count("\n".join(lines) + "\n") == 3


def test_names_that_repeat_every_n_rows_decide():
    lines = ["timestamp, name, power.draw [W]"]
    for k in range(30):
        names = ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 3090")
        for g, name in enumerate(names):
            lines.append(f"{stamp(100 + k + 0.05 * g, True)}, {name}, 30.0 W")
    trace = parse_trace("\n".join(lines) + "\n")
    assert len(trace.gpu_ids) == 3
    assert trace.names == ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 3090")


@pytest.mark.parametrize(("on_s", "rows"), [(3, 300), (1, 300), (2, 11)])
def test_one_gpu_whose_load_switches_every_few_seconds_stays_one(on_s, rows):
    """One card, one row a second, its load on for ``on_s`` s and off as long: rows 2 × on_s apart read
    alike, and the values alone counted 2 × on_s GPUs (6 GPUs and five times the energy for on_s = 3).
    Rows a second apart are different samples: one GPU."""
    lines = ["timestamp, name, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for k in range(rows):
        busy = (k // on_s) % 2 == 0
        lines.append(f"{stamp(100 + k + 0.003 * (k % 7), True)}, NVIDIA GeForce RTX 4090, "
                     f"{98 if busy else 1} %, {18100 if busy else 1129} MiB, {310.5 if busy else 33.1} W")
    trace = parse_trace("\n".join(lines) + "\n")
    assert len(trace.gpu_ids) == 1 and len(trace.samples) == rows
