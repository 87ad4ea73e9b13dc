"""Digits of other scripts: float() takes '٣٠٠' as 300, so a policy's 'limit: ٣٠٠' set 300 W and a trace
cell '١٠٠ %' read as 100 %, while durations, fault times and overrides refused them. Policies and traces
now take ASCII digits only, as nvidia-smi writes them, and say so where the value is."""

from __future__ import annotations

import pytest

from aithermd.policy.kinds import parse_clock, parse_power
from aithermd.policy.trace import TraceError, parse_trace


@pytest.mark.parametrize("text", ["\u0663\u0660\u0660", "\u0663\u0660\u0660 W", "\u0668\u0660%"])
def test_a_power_value_in_other_digits_is_refused(text):
    with pytest.raises(ValueError):
        parse_power(text)
    assert parse_power("300 W") == ("w", 300.0)


def test_a_clock_value_in_other_digits_is_refused():
    with pytest.raises(ValueError):
        parse_clock("\u0661\u0665\u0660\u0660 MHz")
    assert parse_clock("1500 MHz")[1] == 1500.0


@pytest.mark.parametrize("cell", ["\u0661\u0660\u0660 %", "\u0661\u0660\u0660"])
def test_a_trace_cell_in_other_digits_is_not_a_number(cell):
    head = "timestamp, utilization.gpu [%], power.draw [W]\n"
    ok = parse_trace(head + "2024/01/01 00:00:00.000, 100 %, 250.00 W\n")
    assert len(ok.gpu_ids) == 1 and len(ok.samples) == 1
    with pytest.raises(TraceError, match="is not a number"):
        parse_trace(head + f"2024/01/01 00:00:00.000, {cell}, 250.00 W\n")
