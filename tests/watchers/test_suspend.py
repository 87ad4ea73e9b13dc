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
