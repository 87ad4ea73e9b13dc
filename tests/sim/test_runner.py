"""The runner's parts: simulated clock and sleep, physics stepping, recording, places, flags, report text."""

import argparse
import asyncio
from types import MappingProxyType

import pytest

from aithermd.model import Decision, Event, Layer, PolicyStatus, Snapshot
from aithermd.sim import options, report, runner
from aithermd.sim.machine import SimulatedMachine


def test_sim_clock_moves_only_when_told():
    c = runner.SimClock(start=10.0, wall_start=1000.0)
    assert (c.monotonic(), c.wall()) == (10.0, 1000.0)
    c.advance(2.5)
    c.advance(-1)  # never backwards
    assert (c.monotonic(), c.wall()) == (12.5, 1002.5)


def test_sleep_without_speedup_advances_the_simulated_clock_at_once():
    c = runner.SimClock(start=0.0)
    sleep = runner.sim_sleep(c, 0)
    asyncio.run(sleep(1.0))
    asyncio.run(sleep(0.5))
    assert c.monotonic() == 1.5


def test_speedup_paces_simulated_time_against_the_wall_clock(monkeypatch):
    """--speedup K: simulated time runs K x faster than the wall clock, paced from the first sleep, so the
    time ticks spend counts against the next wait (no timing: the wall clock and the waits are recorded)."""
    wall = [500.0]
    waits: list[float] = []

    async def fake_sleep(seconds):
        waits.append(round(seconds, 9))
        wall[0] += seconds

    monkeypatch.setattr(runner.time, "monotonic", lambda: wall[0])
    monkeypatch.setattr(runner.asyncio, "sleep", fake_sleep)
    c = runner.SimClock(start=0.0)
    sleep = runner.sim_sleep(c, 10)

    async def go():
        await sleep(1.0)  # 1 simulated s = 0.1 s of wall time
        wall[0] += 0.04  # a tick that took 40 ms of wall time
        await sleep(2.0)  # due 0.3 s after the start: 0.16 s left to wait
        wall[0] += 1.0  # a tick longer than the sleep: no waiting, and no debt carried as a negative wait
        await sleep(1.0)

    asyncio.run(go())
    assert waits == [0.1, 0.16, 0.0]
    assert c.monotonic() == 4.0


def test_a_cancelled_sleep_moves_nothing():
    c = runner.SimClock(start=0.0)
    sleep = runner.sim_sleep(c, 0.001)  # a 1000 s wait in wall time

    async def go():
        task = asyncio.ensure_future(sleep(1.0))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert c.monotonic() == 0.0


def test_stepper_integrates_long_ticks_in_one_second_steps(tmp_path):
    m = SimulatedMachine(tmp_path / "m")
    seen = []
    step = m.step
    m.step = lambda dt: (seen.append(dt), step(dt))  # type: ignore[method-assign]
    stepper = runner.Stepper(m, t0=100.0, out=None)
    stepper(100.0)
    stepper(102.5)
    assert seen == [1.0, 1.0, 0.5] and m.t_s == 2.5
    m.close()


def test_busy_jobs_report_their_progress_rate_as_aithermctl_run_would(tmp_path):
    """--progress: every 5 s, each GPU's job reports the whole steps it did over that time (3 a second at
    full speed); an idle GPU reports nothing, and a refused report does not stop the simulation."""
    from aithermd.sim.loop import STEPS_PER_WORK

    m = SimulatedMachine(tmp_path / "m")
    reports: list[tuple[float, list[str], float]] = []

    def report(gpus, rate):
        reports.append((m.t_s, gpus, rate))
        if m.t_s > 170:
            raise ValueError("refused")

    stepper = runner.Stepper(m, t0=0.0, out=None, report=report)
    for t in range(1, 181):
        stepper(float(t))
    assert all(t >= 120 for t, _g, _r in reports)  # the default cycle idles for 2 minutes
    by_gpu = {g: [r for t, (g2,), r in reports if g2 == g and t > 130] for (g,) in (["gpu0"], ["gpu1"])}
    for rates in by_gpu.values():
        assert len(rates) >= 8
        assert all(0 < r <= STEPS_PER_WORK + 0.2 for r in rates)  # whole steps over 5 s: ±0.2/s
    assert reports[-1][0] == 180.0
    m.close()


def snap(t, states, **kw):
    status = PolicyStatus(active="p", states=MappingProxyType(states))
    return Snapshot(seq=1, t_mono=t, t_wall=t, policy=status, **kw)


def test_recorder_times_states_and_keeps_actuations():
    rec = runner.Recorder(t0=100.0)
    rec(snap(100.0, {"p": {"gpu0": "idle"}}), [])
    rec(snap(101.0, {"p": {"gpu0": "idle"}}), [])
    ev = Event(kind="actuation", t_wall=0, subject="gpu0/power_limit", message="",
               data={"old": 450.0, "new": 600.0, "unit": "W", "rule": "p/raise"})
    fault = Event(kind="fault", t_wall=0, subject="x", message="")
    dec = Decision("gpu0/power_limit", 600.0, Layer.POLICY, "p/raise", reason="sustained load")
    rec(snap(102.0, {"p": {"gpu0": "training"}}, decisions={"gpu0/power_limit": dec}), [ev, fault])
    rec(snap(105.0, {"p": {"gpu0": "training"}}), [])
    assert rec.state_s == {"p/gpu0": {"idle": 2.0, "training": 3.0}}
    assert rec.actuations == [{"t_s": 2.0, "knob": "gpu0/power_limit", "old": 450.0, "new": 600.0,
                               "unit": "W", "rule": "p/raise", "reason": "sustained load"}]
    assert rec.held_idle == {}


def test_recorder_keeps_when_a_gpu_was_first_found_held_high_and_the_most_a_lock_recovered():
    rec = runner.Recorder(t0=100.0)
    for t, recovered in ((200.0, 0.0), (201.0, 11.5), (202.0, 9.0)):
        held = {"for_s": 60.0 + t - 200.0, "held_w": 70.0, "floor_w": 27.0, "recovered_w": recovered}
        rec(snap(t, {}, attrs={"gpu1": {"held_idle": held}}), [])
    assert rec.held_idle == {"gpu1": {"first_s": 40.0, "held_w": 70.0, "floor_w": 27.0, "recovered_w": 11.5,
                                      "held_s": 3.0}}


def test_places_keep_the_machine_inside_a_given_state_dir(tmp_path, monkeypatch):
    given = runner.make_places(tmp_path / "state")
    assert given.state_dir == tmp_path / "state" and given.machine_dir.parent == given.state_dir
    assert given.remove == (given.machine_dir,)  # the state dir itself is the caller's
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    temp = runner.make_places(None)
    assert temp.state_dir.parent == temp.machine_dir.parent == temp.remove[0]
    assert temp.remove[0].parent == tmp_path / "t"
    runner.cleanup(temp)
    assert list((tmp_path / "t").iterdir()) == []


def args(**kw):
    base = dict(sim_duration_s=None, sim_speedup=1.0, sim_trace=None, sim_gpu_profiles=[], sim_seed=0,
                state_dir=None, sim_json=False)
    return argparse.Namespace(**{**base, **kw})


def test_options_from_flags():
    o = runner.options_from_args(args(sim_duration_s=600, sim_speedup=20))
    assert (o.duration_s, o.speedup, o.state_dir) == (600, 20, None)
    for bad in (dict(sim_duration_s=0), dict(sim_speedup=-1)):
        with pytest.raises(ValueError):
            runner.options_from_args(args(**bad))


def test_the_cycle_flags_shape_the_default_cycle_and_refuse_a_trace():
    o = runner.options_from_args(args(sim_cycle=(60.0, 600.0, 30.0), sim_busy="decode", sim_held_idle=True))
    w = runner.make_workload(o)
    assert (w.idle_before_s, w.training_s, w.idle_after_s, w.busy_kind, w.held_idle) == \
        (60.0, 600.0, 30.0, "decode", True)
    assert w.phase(59.0) == "idle" and w.phase(61.0) == "decode"
    with pytest.raises(ValueError, match="not with --trace"):
        runner.options_from_args(args(sim_trace="t.csv", sim_busy="decode"))


@pytest.mark.parametrize("text", ["1,2", "a,b,c", "10,0,10", "-1,5,5", "1,inf,1", "1,nan,1"])
def test_a_bad_cycle_is_refused_with_an_example(text):
    p = argparse.ArgumentParser()
    runner.add_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--cycle", text])
    with pytest.raises(argparse.ArgumentTypeError, match="BEFORE,BUSY,AFTER"):
        options._cycle(text)


def test_flags_parse():
    p = argparse.ArgumentParser()
    p.add_argument("--state-dir")
    runner.add_arguments(p)
    a = p.parse_args(["--simulate", "--duration", "60", "--speedup", "0", "--gpu-profile", "a",
                      "--gpu-profile", "b", "--trace", "t.csv"])
    assert a.simulate and a.sim_duration_s == 60 and a.sim_speedup == 0
    assert [str(x) for x in a.sim_gpu_profiles] == ["a", "b"] and str(a.sim_trace) == "t.csv"


def test_report_text():
    assert report.clock(0) == "0:00" and report.clock(129) == "2:09" and report.clock(3725) == "1:02:05"
    line = report.actuation_line({"t_s": 129, "knob": "gpu0/power_limit", "old": 360.0, "new": 600.0,
                                  "unit": "W", "rule": "ai-training/training-limit"})
    assert "2:09" in line and "360 → 600 W" in line and line.endswith("ai-training/training-limit")
    prog = report.progress_line(150, "training", {"gpu0": {"limit_w": 600, "power_w": 540.2, "temp_c": 66.6}})
    assert prog == "[   2:30] training | gpu0 600 W limit, 540 W, 67 °C"
    prog = report.progress_line(150, "training", {"gpu0": {"limit_w": 600, "power_w": 540.2, "temp_c": 66.6},
                                                  "gpu1": {"limit_w": 300, "power_w": 0, "gone": "removed"}})
    assert prog == "[   2:30] training | gpu0 600 W limit, 540 W, 67 °C | gpu1 removed"
