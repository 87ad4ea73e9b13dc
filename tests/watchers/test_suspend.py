"""The Live coordinator on a simulated clock: a suspend with no resume announced ends after max_pause_s of
awake time, with every owned setting re-applied; the services' events ride on the next snapshot."""

from __future__ import annotations

import asyncio

from aithermd.backends.hwmon import HwmonBackend
from aithermd.runtime.daemon import Daemon
from aithermd.watchers.options import WatcherOptions

from .conftest import NCT, read, settings_for, write


async def test_a_suspend_without_resume_ends_after_max_pause_s(tmp_path, root, policy_dir, clock):
    settings = settings_for(tmp_path, root, policy_dir, policy="steady")
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep,
               watchers=WatcherOptions(max_pause_s=5.0))
    seen = []
    d.hub.add_listener(lambda snap, evs: seen.append((snap.seq, d.tick.applier.paused,
                                                      read(root, f"{NCT}/pwm1_enable"),
                                                      [e.message for e in evs if e.kind == "sleep"])))
    tasks = []

    def step():
        seq = d.hub.latest.seq
        if seq == 2:
            tasks.append(asyncio.ensure_future(d.changes.suspend()))  # PrepareForSleep(true), never a false
        if seq == 3:
            write(root, f"{NCT}/pwm1_enable", 2)  # reset by the driver meanwhile
        return seq >= 10

    assert await d.run(until=step) == 0
    # paused at t2 (1 s ticks): ticks 3–7 write nothing; tick 8, 6 s later, writes again first thing
    assert [s[1] for s in seen] == [False, False, True, True, True, True, True, False, False, False]
    assert [s[2] for s in seen] == [1, 1, 1, 2, 2, 2, 2, 1, 1, 1]  # left alone while paused
    assert [m for s in seen for m in s[3]] == [
        "suspending: writes paused until resume",
        "no resume announced: 1 setting(s) re-applied, 5 found in place, 0 did not stick"]


async def test_the_resume_event_judges_a_knob_by_what_was_written_not_by_the_decision(
        tmp_path, root, policy_dir, clock):
    """attack2 A5: the resume event said a quantised fan "did not stick" when nothing had touched it: it
    compared the read-back (the driver's level, 100 % for a 60 % request on a 3-level driver) with the
    decision. Judged as the applier judges it, it is found in place; a fan reset meanwhile is re-applied."""
    from tests.backends.drivers import DriverIO, dell_smm_level

    io = DriverIO()
    io.levels["pwm2"] = dell_smm_level  # keeps 3 states: 60 % (153) reads back 128, the round-up writes 255
    settings = settings_for(tmp_path, root, policy_dir, policy="steady")
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root), io=io)], sleep=clock.sleep,
               watchers=WatcherOptions(max_pause_s=5.0))
    seen = []
    d.hub.add_listener(lambda snap, evs: seen.extend(e for e in evs if e.kind == "sleep"))

    def step():
        seq = d.hub.latest.seq
        if seq == 2:
            assert read(root, f"{NCT}/pwm2") == 255
            asyncio.ensure_future(d.changes.suspend())
        if seq == 3:
            write(root, f"{NCT}/pwm1_enable", 2)
        return seq >= 10

    assert await d.run(until=step) == 0
    resumed = [e for e in seen if e.data.get("action") != "suspend"]
    assert [e.message for e in resumed] == [
        "no resume announced: 1 setting(s) re-applied, 5 found in place, 0 did not stick"]
    assert "hwmon:nct6798-isa-0290/pwm2" in resumed[0].data["in_place"] and resumed[0].data["failed"] == []
