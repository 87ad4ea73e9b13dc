"""nvidia-smi CSV traces in their real variants, and malformed ones with line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aithermd.policy.loader import resolve_policy
from aithermd.policy.replay import replay
from aithermd.policy.trace import TraceError, normalize, parse_trace
from aithermd.sim.smi_dump import load_dump

UNITS = """timestamp, name, utilization.gpu [%], power.draw [W]
2026/01/03 15:36:53.507, NVIDIA GeForce RTX 4090, 1 %, 33.09 W
2026/01/03 15:36:54.512, NVIDIA GeForce RTX 4090, 0 %, 33.14 W
"""


def test_units_in_header_and_values():
    tr = parse_trace(UNITS)
    assert tr.fields == ("timestamp", "name", "utilization.gpu", "power.draw")
    assert tr.names == ("NVIDIA GeForce RTX 4090",) and tr.gpu_ids == ("0",)
    assert [s.t for s in tr.samples] == [0.0, pytest.approx(1.005)]
    assert tr.samples[0].gpus[0].values == {"utilization.gpu": 1.0, "power.draw": 33.09}


def test_nounits_any_order_and_iso_timestamps():
    text = ("power.draw,utilization.gpu,timestamp,temperature.gpu\n"
            "250.5,61,2025-06-01T10:00:00.000,55\n251,62,2025-06-01T10:00:00.500,56\n")
    tr = parse_trace(text)
    assert [s.t for s in tr.samples] == [0.0, 0.5]
    assert tr.samples[1].gpus[0].values == {"power.draw": 251.0, "utilization.gpu": 62.0, "temperature.gpu": 56.0}


def test_index_column_groups_samples_by_repeat_and_orders_gpus_by_first_appearance():
    text = ("timestamp, index, power.draw [W]\n"
            "2025/06/01 10:00:00.000, 1, 100 W\n2025/06/01 10:00:00.010, 0, 200 W\n"
            "2025/06/01 10:00:01.000, 1, 110 W\n2025/06/01 10:00:01.020, 0, 210 W\n")
    tr = parse_trace(text)
    assert tr.gpu_ids == ("1", "0") and len(tr.samples) == 2
    assert [g.values["power.draw"] for g in tr.samples[1].gpus] == [110.0, 210.0]
    assert tr.period_s == pytest.approx(1.0)


def test_without_index_rows_within_half_a_period_are_one_sample():
    lines = ["timestamp, utilization.gpu [%], power.draw [W]"]
    for k in range(5):
        for g in range(4):  # four GPUs logged a few ms apart, every 100 ms
            lines.append(f"2025/06/01 10:00:00.{k * 100 + g * 3:03d}, {g}, {k * 10 + g} W")
    tr = parse_trace("\n".join(lines) + "\n")
    assert len(tr.gpu_ids) == 4 and len(tr.samples) == 5
    assert tr.period_s == pytest.approx(0.1, abs=0.01)
    assert [g.values["utilization.gpu"] for g in tr.samples[3].gpus] == [0, 1, 2, 3]
    assert tr.samples[3].t == pytest.approx(0.3)


def test_gaps_in_time_are_kept():
    text = ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n2025/06/01 10:00:01.000, 10 W\n"
            "2025/06/01 10:05:01.000, 10 W\n2025/06/01 10:05:02.000, 10 W\n")
    tr = parse_trace(text)
    assert [s.t for s in tr.samples] == [0.0, 1.0, 301.0, 302.0]
    assert tr.period_s == 1.0


def test_without_timestamp_samples_are_one_second_apart():
    tr = parse_trace("utilization.gpu [%]\n5 %\n6 %\n")
    assert [s.t for s in tr.samples] == [0.0, 1.0]


def test_unknown_markers_and_lost_gpus():
    text = ("timestamp, power.draw [W], temperature.gpu, pstate, mig.mode.current\n"
            "2025/06/01 10:00:00.000, [N/A], [GPU is lost], P0, Disabled\n"
            "2025/06/01 10:00:01.000, [Not Supported], 40, P8, Disabled\n")
    tr = parse_trace(text)
    first, second = (s.gpus[0] for s in tr.samples)
    assert first.values == {"power.draw": None, "temperature.gpu": None}
    assert first.failed == frozenset({"temperature.gpu"})
    assert first.text == {"pstate": "P0", "mig.mode.current": "Disabled"}
    assert second.values["temperature.gpu"] == 40.0


@pytest.mark.parametrize("text, line, message", [
    ("", 1, "empty trace"),
    ("2025/06/01 10:00:00.000, 10 W\n", 1, "no header line"),
    ("timestamp, memory.used [MiB]\n2025/06/01 10:00:00.000, 10 MiB\n", 1, "none of power.draw"),
    ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n2025/06/01 10:00:01.000\n", 3,
     "expected 2 fields as in the header, found 1"),
    ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n\n2025/06/01 10:00:01.000, lots W\n", 4,
     "power.draw: 'lots W' is not a number"),
    ("timestamp, power.draw [W]\nyesterday, 10 W\n", 2, "timestamp 'yesterday' is not"),
    ("timestamp, power.draw [W]\n2025/06/01 10:00:05.000, 10 W\n2025/06/01 10:00:01.000, 10 W\n", 3,
     "time goes backwards"),
    ("timestamp, power.draw [W]\n", 2, "no samples after the header"),
    ("timestamp, power.draw [W], power.draw.average [W]\n", 1, "column 'power.draw' appears twice"),
    ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, nan W\n", 2, "not a finite number"),
    # a value no nvidia-smi field holds: it would make the replay's energy infinite (invalid JSON)
    ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n2025/06/01 10:00:01.000, 1e308 W\n", 3,
     "power.draw: '1e308 W' is out of range (0 to 10000000)"),
    ("timestamp, utilization.gpu [%]\n2025/06/01 10:00:00.000, -3 %\n", 2,
     "utilization.gpu: '-3 %' is out of range (0 to 100): fix or delete the line"),
    ("timestamp, utilization.gpu [%]\n2025/06/01 10:00:00.000, 5000 %\n", 2,
     "utilization.gpu: '5000 %' is out of range (0 to 100)"),
    ("timestamp, fan.speed [%], power.draw [W]\n2025/06/01 10:00:00.000, 101 %, 10 W\n", 2,
     "fan.speed: '101 %' is out of range (0 to 100)"),
    ("timestamp, power.draw [W]\n2025/02/30 10:00:00.000, 10 W\n", 2, "has an impossible date"),
    # what the csv module refuses still names its line, not line 0
    ("timestamp, power.draw [W]\n2025/06/01 10:00:00.000, 10 W\n2025/06/01 10:00:01.000, \"" + "x" * 200_000
     + "\"\n", 3, "CSV: field larger than field limit"),
])
def test_malformed_traces_say_where(text, line, message):
    with pytest.raises(TraceError) as info:
        parse_trace(text, "t.csv")
    assert info.value.line == line and message in info.value.message
    assert str(info.value).startswith(f"t.csv:{line}: ")


def test_a_temperature_below_zero_is_a_reading_not_an_error():
    tr = parse_trace("timestamp, temperature.gpu\n2025/06/01 10:00:00.000, -5\n")
    assert tr.samples[0].gpus[0].values == {"temperature.gpu": -5.0}


def test_normalize_folds_aliases_and_units():
    assert normalize(" power.draw.average [W] ") == ("power.draw", "W")
    assert normalize("clocks.current.sm [MHz]") == ("clocks.sm", "MHz")
    assert normalize("Index") == ("index", None)


PROFILE = load_dump(Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-q"
                    / "rtx4090-nvidia-smi-q-x-driver535.xml")[0]
CELLS = ["2025/06/01 10:00:00.000", "2025/06/01 10:00:01", "2025-06-01T10:00:02Z", "0", "1", "GPU-a", "[N/A]",
         "50 %", "300 W", "-1", "1e308", "", "x", "P0", "nan", '"', "2025/06/01 23:59:60.999"]


FIELDS = ["timestamp", "index", "uuid", "name", "power.draw [W]", "utilization.gpu [%]", "temperature.gpu"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=5, unique=True),
       st.lists(st.lists(st.one_of(st.sampled_from(CELLS), st.text(max_size=5)), min_size=1, max_size=6),
                max_size=6))
def test_random_traces_parse_or_name_their_line(header, rows):
    """Any text is either a trace whose replay gives strict JSON, or a TraceError naming a line ≥ 1."""
    text = ", ".join(header) + "\n" + "\n".join(", ".join(r) for r in rows) + "\n"
    try:
        trace = parse_trace(text, "t.csv")
    except TraceError as exc:
        assert exc.line >= 1 and str(exc).startswith(f"t.csv:{exc.line}: ")
        return
    doc = replay(trace, [PROFILE] * len(trace.gpu_ids), resolve_policy("ai-training"))
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize("value, why", [("17.53 kW", "is not in W"), ("33 garbage words", "is not in W"),
                                        ("33.09 %", "is not in W")])
def test_a_power_value_in_another_unit_or_with_words_after_it_is_a_malformed_line(value, why):
    """A new user's trace: '17.53 kW' was read as 17.53 W and '33 garbage words' as 33 W, silently."""
    text = f"timestamp, power.draw [W], utilization.gpu [%]\n2026/01/03 15:36:53.000, {value}, 50 %\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, "t.csv")
    assert info.value.line == 2 and why in str(info.value) and "fix or delete the line" in str(info.value)
