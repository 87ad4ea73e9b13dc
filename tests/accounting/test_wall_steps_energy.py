"""An NTP step of the wall clock (±8 h, +25 h) neither stretches nor cuts an energy window, how long the
ledger keeps an exited process, or the meter's intervals (attack4 B4); a window restored after a restart
keeps its duration. The clock is the tests' FakeClock: monotonic and boot time run on, the wall clock
steps."""

from __future__ import annotations

import pytest

from aithermd.accounting.ledger import Ledger
from aithermd.accounting.meter import Increment
from aithermd.accounting.windows import EnergyWindows
from tests.accounting.bench import Bench

STEPS = (-8 * 3600.0, 8 * 3600.0, 25 * 3600.0)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("restart", [False, True])
def test_an_energy_window_measures_its_own_duration(clock, step, restart):
    """``aithermctl energy -- CMD`` for a 10-minute job at 300 W, the wall clock stepped 2 minutes in."""
    windows = EnergyWindows(clock)
    wid = windows.start("job", 3600.0, uid=1000)
    for s in range(600):
        clock.advance(1.0)
        if s == 120:
            clock.step_wall(step)
        if restart and s == 300:  # the daemon restarts: the window is saved and restored
            saved = windows.to_json()
            windows = EnergyWindows(clock)
            assert windows.restore(saved) == 1
        windows.add(Increment(1.0, {"gpu0": 300.0}, {}))
    doc = windows.stop(wid, uid=1000)
    assert not doc.get("timed_out")
    assert (doc["duration_s"], doc["total_j"]) == (pytest.approx(600.0), pytest.approx(180_000.0))
    assert doc["total_j"] / doc["duration_s"] == pytest.approx(300.0)  # the mean power aithermctl prints


def test_a_window_times_out_on_its_own_clock(clock):
    windows = EnergyWindows(clock)
    wid = windows.start("job", 60.0, uid=1000)
    clock.advance(30.0)
    clock.step_wall(25 * 3600.0)  # a forward step past the timeout ends nothing
    windows.add(Increment(30.0, {"gpu0": 30.0}, {}))
    assert windows.open_count() == 1
    clock.advance(31.0)
    windows.add(Increment(31.0, {"gpu0": 31.0}, {}))
    doc = windows.stop(wid, uid=1000)
    assert doc["timed_out"] and doc["duration_s"] == pytest.approx(60.0)


@pytest.mark.parametrize("step", (-8 * 3600.0, 8 * 3600.0))
def test_exited_processes_are_kept_their_time_whatever_the_wall_clock(tmp_path, step):
    """The energy service's ledger keeps an exited process ``keep_exited_s`` on the boot clock."""
    bench = Bench(tmp_path, gpus=1)
    service = bench.start_daemon(None)
    service.accountant.ledger = Ledger(keep_exited_s=600.0)
    bench.job(5001, 101, {0: 1.0})
    bench.util[0], bench.power["gpu0"] = 100.0, 300.0
    bench.run(10)
    bench.procs.stop(5001)
    bench.clock.step_wall(step)
    bench.run(300)  # 5 min after it exited: still listed

    def kept() -> bool:
        return any(pid == 5001 for pid, _ in service.accountant.ledger.processes)

    assert kept()
    bench.run(320)  # 10 min 20 s after: gone
    assert not kept()


@pytest.mark.parametrize("step", (-8 * 3600.0, 25 * 3600.0))
def test_the_meter_times_its_intervals_on_the_boot_clock(tmp_path, step):
    """A counter that goes back (a reset) 1 s after a wall step is estimated over that second, not counted as
    hours of unmeasured time (or a negative gap); the increment's dt_s is 1 s."""
    bench = Bench(tmp_path, gpus=1)
    service = bench.start_daemon(None)
    bench.power["gpu0"] = 300.0
    bench.run(5)
    bench.clock.step_wall(step)
    bench.counters["gpu0"] = 0.0  # the driver reloaded: the counter restarts
    bench.clock.advance(1.0)
    inc = service.meter.feed(bench.snapshot())
    assert inc.dt_s == pytest.approx(1.0)
    assert inc.joules["gpu0"] == pytest.approx(300.0) and not inc.unmeasured_s
