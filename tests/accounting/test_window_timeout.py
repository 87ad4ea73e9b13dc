"""A window that reaches its timeout keeps what it measured up to then for its stop (it was dropped:
`aithermctl energy --timeout 1s -- sleep 30` then lost the measurement and CMD's exit status). Fake clock."""

from __future__ import annotations

import pytest

from aithermd.accounting.meter import EnergyMeter
from aithermd.accounting.windows import KEEP_ENDED_S, EnergyWindows, NotOwner, UnknownWindow
from aithermd.publish.reference import reference_snapshot
from tests.support.clock import SimClock


def _fed(clock):
    windows, meter = EnergyWindows(clock), EnergyMeter()
    windows.on_publish = lambda snap: windows.add(meter.feed(snap))
    windows.on_publish(reference_snapshot(1))
    return windows


def test_a_timed_out_window_stops_summing_at_its_timeout_and_its_stop_returns_the_sums():
    clock = SimClock()
    windows = _fed(clock)
    wid = windows.start("sleep", 2.0, uid=1000, scope="pid:4242")
    for seq in range(2, 8):  # every energy counter grows 100 J per 1 s tick; the timeout falls at seq 3
        clock.advance(1.0)
        windows.on_publish(reference_snapshot(seq))
    assert windows.open_count() == 0 and windows.list(1000) == []
    with pytest.raises(NotOwner):
        windows.stop(wid, uid=1001)
    result = windows.stop(wid, uid=1000)
    assert result["timed_out"] is True and result["duration_s"] == 2.0 and result["name"] == "sleep"
    assert result["joules"]["gpu0"] == 200.0 and result["total_j"] == 600.0  # seq 1 → 3 only
    assert result["scope"] == "pid:4242"
    with pytest.raises(UnknownWindow):  # once
        windows.stop(wid, uid=1000)


def test_a_timed_out_window_waits_a_day_for_its_stop():
    clock = SimClock()
    windows = _fed(clock)
    wid = windows.start("forgotten", 1.0, uid=0)
    clock.advance(1.0 + KEEP_ENDED_S)
    windows.on_publish(reference_snapshot(2))
    with pytest.raises(UnknownWindow):
        windows.stop(wid, uid=0)
    stopped = windows.start("stopped in time", 0.0, uid=0)
    clock.advance(5.0)
    assert "timed_out" not in windows.stop(stopped, uid=0)
