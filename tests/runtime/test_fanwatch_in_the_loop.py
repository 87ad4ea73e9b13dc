"""A fan that dies mid-run, caught by the whole daemon on the simulated workstation: kick-start, then the
stalled alarm (event, snapshot, metric), and its zone as a failed cooler — with the fans detected and
calibrated first, and without (paired by number: an alarm, but no drastic step on a guess)."""

from __future__ import annotations

import asyncio

from aithermctl.render import status_text
from aithermd.publish.document import snapshot_document
from aithermd.publish.fan_metrics import FanCollector, StallCounter
from aithermd.settings import DaemonSettings
from aithermd.sim.runner import SimOptions, simulate

NOON = 1_767_268_800.0
NCT = "hwmon:nct6798-isa-0290"
DIES_AT_S = 150.0


class Hub:
    """Records what the daemon published (a hub listener) and serves the latest snapshot as the hub does."""

    def __init__(self):
        self.events, self.latest, self.counter = [], None, StallCounter()

    def __call__(self, snapshot, events):
        self.latest = snapshot
        self.events += [(snapshot.t_mono, e) for e in events]
        self.counter.on_publish(snapshot, events)


def run(tmp_path, *, calibrate: bool, duration_s: float = 200.0) -> Hub:
    hub = Hub()
    settings = DaemonSettings(policy="balanced", policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error")
    opts = SimOptions(duration_s=duration_s, speedup=0, seed=3, wall_start=NOON,
                      state_dir=tmp_path / "state", calibrate_fans=calibrate,
                      fan_dies={"nct6798/fan4": DIES_AT_S}, listeners=[hub])
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0
    return hub


def alarms(hub, what):
    return [(t, e) for t, e in hub.events if e.kind == "alarm" and e.data.get("alarm") == what]


def test_a_dying_fan_is_kicked_then_stalled_and_its_zone_is_a_failed_cooler(tmp_path):
    hub = run(tmp_path, calibrate=True)
    t0 = hub.events[0][0]
    (kick_t, kick), = alarms(hub, "kick")
    (stall_t, stall), = alarms(hub, "stalled")
    assert kick.subject == stall.subject == f"{NCT}/fan4"
    assert DIES_AT_S < kick_t - t0 < DIES_AT_S + 10  # seized, coasted to a stop, 3 s low, kicked
    assert stall_t - kick_t >= 4.0  # full duty for the kick's 4 s first
    assert "zone is treated as a failed cooler" in stall.message
    snap = hub.latest
    assert snap.alarms[f"{NCT}/fan4"].kind == "stalled"
    stalled = {k for k, a in snap.alarms.items() if a.kind == "stalled"}
    assert stalled == {f"{NCT}/fan4"}  # no false alarm
    assert {k: a.kind for k, a in snap.alarms.items() if a.kind == "empty"} == {
        f"{NCT}/pwm5": "empty", f"{NCT}/pwm6": "empty"}  # detection found their headers empty
    d = snap.decisions
    assert (d[f"{NCT}/pwm4"].rule, d[f"{NCT}/pwm4"].value) == ("safety/stalled-fan", 100.0)
    for other in ("pwm1", "pwm2", "pwm3"):  # the zone's other fans take over at full
        assert (d[f"{NCT}/{other}"].rule, d[f"{NCT}/{other}"].value) == ("safety/failed-cooler", 100.0)
    knobs = {k.id: k for dev in snap.devices for k in dev.knobs}
    for gpu in ("gpu0/power_limit", "gpu1/power_limit"):  # the zone reads both GPUs' temperatures
        assert d[gpu].rule == "safety/failed-cooler" and d[gpu].value == knobs[gpu].min
        assert snap.knobs[gpu].value == knobs[gpu].min  # written
    # (the CPU chip is in the zone too, but the simulated RAPL zone states no minimum PL1 to lower it to:
    # as for a critical temperature, nothing is written to it)
    # the metric a Prometheus alert reads
    families = {f.name: f for f in FanCollector(hub, hub.counter).collect()}
    stalled = {s.labels["sensor"]: s.value for s in families["aithermd_fan_stalled"].samples
               if s.labels["chip"] == "nct6798-isa-0290"}
    assert stalled == {"fan1": 0, "fan2": 0, "fan3": 0, "fan4": 1, "fan5": 0, "fan6": 0}
    total = {s.labels["sensor"]: s.value for s in families["aithermd_fan_stalls"].samples
             if s.name.endswith("_total") and s.labels["chip"] == "nct6798-isa-0290"}
    assert total["fan4"] == 1 and total["fan1"] == 0
    # and what 'aithermctl status' prints of the document the daemon publishes
    text = status_text(snapshot_document(snap))
    listed = text[text.index("\nAlarms\n"):].splitlines()
    assert f"  ! stalled: {NCT}/fan4 has stalled: no speed at full duty after a kick-start. Its zone is " \
        "treated as a failed cooler." in listed
    fan4 = next(line for line in text.splitlines() if "fan4" in line and "RPM" in line)
    assert fan4.endswith("! stalled") and "safety/stalled-fan" in fan4


def test_paired_by_number_a_dying_fan_is_an_alarm_but_not_a_failed_cooler(tmp_path):
    hub = run(tmp_path, calibrate=False)
    (_, stall), = alarms(hub, "stalled")
    assert stall.subject == f"{NCT}/fan4" and "run 'aithermctl fans detect'" in stall.message
    snap = hub.latest
    assert snap.decisions[f"{NCT}/pwm4"].rule == "safety/stalled-fan"
    assert not any(d.rule == "safety/failed-cooler" for d in snap.decisions.values())
    # fan6 never turned: an empty header, not a stall; fan5 (CPU_OPT on pwm2's output) raised nothing
    assert snap.alarms[f"{NCT}/fan6"].kind == "empty"
    assert set(snap.alarms) == {f"{NCT}/fan4", f"{NCT}/fan6"}
