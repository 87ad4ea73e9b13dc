"""Issue 22: nothing the daemon keeps grows once its history is full. The hub's recent events were bounded
by count alone (1000), so on the reference tree (~0.4 actuation events a tick) they kept growing for ~40
minutes after the 15-minute history was full (~0.9 MB of RSS); now no event older than the history is kept,
and at most ``events_max``."""

from __future__ import annotations

import random

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Event, Snapshot
from aithermd.publish.hub import StateHub
from aithermd.runtime.daemon import Daemon
from aithermd.settings import DaemonSettings
from tests.support.machines import copy_machine

HISTORY_S = 60.0


def tctl_file(root):
    return next(p for p in (root / "devices").rglob("temp1_input")
                if (p.parent / "name").read_text().strip() == "k10temp")


async def test_the_daemons_events_stay_within_the_history_once_it_is_full(tmp_path, clock):
    root = copy_machine(tmp_path)
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none", nvml=False)
    hub = StateHub(history_s=HISTORY_S)
    d = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=clock.sleep, hub=hub)
    tctl, rng, temp = tctl_file(root), random.Random(1), 60_000
    published = []
    hub.add_listener(lambda snap, evs: published.extend(e for e in evs if e.kind == "actuation"))
    n = int(HISTORY_S)  # ticks of 1 s after the history is full
    kept = {}

    def step():
        nonlocal temp
        seq = d.hub.latest.seq
        temp = min(88_000, max(35_000, temp + rng.choice((-3000, -1000, 0, 1000, 3000))))
        tctl.write_text(f"{temp}\n")  # a random walk, so the board fans' curve moves and they are written
        if seq in (n + n, n + 2 * n, n + 4 * n):
            kept[seq] = d.hub.recent_events(limit=10**6)
        return seq >= n + 4 * n

    assert await d.run(until=step) == 0
    assert len(published) > 200  # a busy machine: more events than one history holds
    for seq, events in kept.items():
        oldest = clock.wall() - (n + 4 * n - seq) - HISTORY_S - 1.0  # the wall time of that tick − history
        assert all(e.t_wall >= oldest for e in events), seq
        assert len(events) <= 100
    assert len(kept[n + 4 * n]) <= len(kept[n + n]) + 30  # flat, within the walk's noise


def snap(t: float) -> Snapshot:
    return Snapshot(seq=int(t), t_mono=t, t_wall=1e9 + t)


def test_a_quiet_hub_forgets_events_older_than_its_history():
    hub = StateHub(history_s=900.0)
    for t in range(0, 7200):  # 2 simulated hours, one event every 10 s
        hub.publish(snap(float(t)), [Event("actuation", 1e9 + t, "k", "m")] if t % 10 == 0 else [])
        if t in (1800, 3600, 7190):
            events = hub.recent_events(limit=10**6)
            assert len(events) == 91  # [t − 900, t]: the same count an hour on
            assert events[0].t_wall == 1e9 + t - 900.0


def test_a_busy_hub_keeps_at_most_events_max():
    hub = StateHub(history_s=900.0, events_max=50)
    for t in range(300):
        hub.publish(snap(float(t)), [Event("actuation", 1e9 + t, "k", str(i)) for i in range(3)])
    events = hub.recent_events(limit=10**6)
    assert len(events) == 50 and events[-1].t_wall == 1e9 + 299 and events[-1].message == "2"
