"""The control loop in process: a fake backend, the stub engine, a simulated clock."""

from __future__ import annotations

import json

import pytest

from aithermd.actuate.journal import Journal
from aithermd.errors import UnknownPolicy
from aithermd.model import Layer
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE, write_policy


def make(settings, clock, backend, **kw):
    return Daemon(settings, clock=clock, backends=[backend], sleep=clock.sleep, engine=STUB_ENGINE, **kw)


async def test_takes_the_fans_under_control_and_restores_them_on_stop(settings, clock):
    b = FakeBackend(start_pwm=100, start_enable=2)
    d = make(settings, clock, b)
    seen = []
    code = await d.run(max_ticks=3, until=lambda: seen.append(
        (dict(b.pwm), dict(b.enable), Journal(settings.state_dir).dirty)) and False)
    assert code == 0
    assert seen[0] == ({"pwm1": 153, "pwm2": 153}, {"pwm1": 1, "pwm2": 1}, True)  # 60 % = 153/255
    assert len(b.writes) == 2  # later ticks are no-ops
    assert b.pwm == {"pwm1": 100, "pwm2": 100} and b.enable == {"pwm1": 2, "pwm2": 2}
    assert not Journal(settings.state_dir).dirty
    snap = d.hub.latest
    assert snap.seq == 3 and snap.policy.active == "balanced"
    assert snap.decisions[b.kid("pwm1")].rule == "balanced/fans"
    assert snap.knobs[b.kid("pwm1")].value == pytest.approx(60.0, abs=0.3)
    assert [e.kind for e in d.hub.recent_events()].count("actuation") == 2


async def test_ticks_follow_the_monotonic_deadlines(settings, clock):
    b = FakeBackend()
    d = make(settings, clock, b)
    t0 = clock.monotonic()
    times = []
    await d.run(max_ticks=4, until=lambda: times.append(d.hub.latest.t_mono) and False)
    assert times == [t0, t0 + 1.0, t0 + 2.0, t0 + 3.0]


async def test_a_dirty_journal_is_restored_before_the_first_tick(settings, clock):
    b = FakeBackend(start_pwm=40, start_enable=2)
    j = Journal(settings.state_dir)
    j.record(b.kid("pwm1"), b.device_id, b.locator(), {"pwm": 40, "enable": 2}, 0)
    b.pwm["pwm1"], b.enable["pwm1"] = 255, 1  # what the crashed run left
    restored_before_first_sample = []
    d = make(settings, clock, b, before_sample=lambda t: restored_before_first_sample.append(
        (b.pwm["pwm1"], b.enable["pwm1"])))
    assert await d.run(max_ticks=1) == 0
    assert restored_before_first_sample[0] == (40, 2)
    assert b.pwm["pwm1"] == 40 and b.enable["pwm1"] == 2


async def test_a_failed_sensor_drives_its_fans_to_full_and_is_reported_once(settings, clock):
    b = FakeBackend()
    b.failed_temps.add("temp1")
    d = make(settings, clock, b)
    pwm_seen = []
    await d.run(max_ticks=3, until=lambda: pwm_seen.append(dict(b.pwm)) and False)
    assert pwm_seen[0] == {"pwm1": 255, "pwm2": 255}
    snap = d.hub.latest
    assert b.kid("temp1") in snap.degraded
    assert snap.decisions[b.kid("pwm1")].layer is Layer.SAFETY
    faults = [e for e in d.hub.recent_events() if e.kind == "fault"]
    assert len(faults) == 1 and faults[0].subject == b.kid("temp1")


async def test_a_backend_whose_sample_raises_marks_every_channel_failed(settings, clock):
    b = FakeBackend()

    def broken():
        raise OSError("EIO on everything")

    d = make(settings, clock, b)
    b.sample = broken  # type: ignore[method-assign]
    assert await d.run(max_ticks=2) == 0
    snap = d.hub.latest
    assert {b.kid("temp1"), b.kid("temp2")} <= set(snap.degraded)
    assert snap.decisions[b.kid("pwm1")].layer is Layer.SAFETY
    assert b.pwm == {"pwm1": 100, "pwm2": 100}  # restored on stop
    assert any("sample failed" in e.message for e in d.hub.recent_events())


async def test_a_lost_device_is_reported_and_skipped_and_the_loop_runs_on(settings, clock):
    b = FakeBackend()
    other = FakeBackend("other")
    d = Daemon(settings, clock=clock, backends=[b, other], sleep=clock.sleep, engine=STUB_ENGINE)

    def lose(t):
        if d.hub.latest is not None and d.hub.latest.seq >= 1:
            b.lost = True

    d.before_sample = lose
    # 1: at stop the vanished chip's fans cannot be put back (DeviceLost, as on hardware): their originals
    # stay journaled for 'aithermd restore'
    assert await d.run(max_ticks=4) == 1
    snap = d.hub.latest
    assert b.device_id in snap.degraded
    lost_events = [e for e in d.hub.recent_events() if e.kind == "fault" and e.subject == b.device_id]
    assert len(lost_events) == 1 and "lost" in lost_events[0].message
    assert other.pwm == {"pwm1": 100, "pwm2": 100} and len(other.writes) == 2


async def test_an_engine_failure_is_a_fault_not_an_exit(settings, clock, policy_dir):
    write_policy(policy_dir, "broken", 50.0, explode=True)
    b = FakeBackend()
    d = make(settings.replace(**{"policy": "broken", "policy_pinned": True}), clock, b)
    assert await d.run(max_ticks=2) == 0
    assert b.writes == []
    assert any("policy engine failed" in e.message for e in d.hub.recent_events())


async def test_knobs_no_decision_claims_are_handed_back(settings, clock):
    b = FakeBackend(start_pwm=90, start_enable=2)
    d = make(settings, clock, b)
    during = []

    def step():
        snap = d.hub.latest
        during.append((snap.seq, dict(b.pwm), dict(b.enable)))
        if snap.seq == 1:
            d.control.set_active_policy("handsoff")
        return False

    await d.run(max_ticks=3, until=step)
    assert during[0][1] == {"pwm1": 153, "pwm2": 153}
    assert during[1][1] == {"pwm1": 90, "pwm2": 90} and during[1][2] == {"pwm1": 2, "pwm2": 2}
    assert not Journal(settings.state_dir).dirty
    assert [e.kind for e in d.hub.recent_events()].count("restore") == 2


async def test_dry_run_decides_and_logs_but_writes_nothing(settings, clock):
    b = FakeBackend(start_pwm=100, start_enable=2)
    d = make(settings.replace(**{"dry_run": True}), clock, b)
    assert await d.run(max_ticks=3) == 0
    assert b.writes == [] and b.pwm == {"pwm1": 100, "pwm2": 100} and b.enable == {"pwm1": 2, "pwm2": 2}
    assert not settings.state_dir.exists() or not Journal(settings.state_dir).dirty
    snap = d.hub.latest
    assert snap.dry_run and snap.decisions[b.kid("pwm1")].value == 60.0
    acts = [e for e in d.hub.recent_events() if e.kind == "actuation"]
    assert len(acts) == 2 and all(e.data["dry_run"] for e in acts)


async def test_another_program_rewriting_a_fan_makes_the_daemon_step_back(settings, clock):
    b = FakeBackend()
    d = make(settings, clock, b)

    def fancontrol(t):
        if d.hub.latest is not None:
            b.rewriter["pwm2"] = 200

    d.before_sample = fancontrol
    await d.run(max_ticks=8)
    kinds = [(e.kind, e.subject) for e in d.hub.recent_events()]
    assert ("conflict", b.kid("pwm2")) in kinds and ("conflict", b.kid("pwm1")) not in kinds
    pwm2_writes = [w for w in b.writes if w[0] == b.kid("pwm2")]
    assert len(pwm2_writes) == 3  # the first, two more attempts, then no fight
    assert b.kid("pwm2") in d.hub.latest.degraded


async def test_overrides_and_the_active_policy_persist_across_restarts(settings, clock):
    b = FakeBackend()
    d = make(settings, clock, b)

    def operate():
        d.control.set_active_policy("quiet")
        d.control.set_override(b.kid("pwm2"), 80.0, 0)
        return False

    await d.run(max_ticks=2, until=operate)
    assert d.hub.latest.decisions[b.kid("pwm2")].layer is Layer.OVERRIDE
    kept = json.loads((settings.state_dir / "operator.json").read_text())
    assert kept["active_policy"] == "quiet" and kept["overrides"][b.kid("pwm2")]["value"] == 80.0
    b2 = FakeBackend()
    d2 = make(settings, clock, b2)
    await d2.run(max_ticks=1, until=lambda: False)
    snap = d2.hub.latest
    assert snap.policy.active == "quiet"
    assert snap.decisions[b2.kid("pwm1")].value == 30.0 and snap.decisions[b2.kid("pwm2")].value == 80.0


async def test_the_policy_flag_wins_over_the_kept_choice(settings, clock):
    (settings.state_dir).mkdir(parents=True)
    (settings.state_dir / "operator.json").write_text(json.dumps({"active_policy": "quiet"}))
    d = make(settings.replace(**{"policy": "balanced", "policy_pinned": True}), clock, FakeBackend())
    await d.run(max_ticks=1)
    assert d.hub.latest.policy.active == "balanced"
    d2 = make(settings, clock, FakeBackend())
    await d2.run(max_ticks=1)
    assert d2.hub.latest.policy.active == "quiet"


async def test_an_override_expires(settings, clock):
    b = FakeBackend()
    d = make(settings, clock, b)

    def operate():
        if d.hub.latest.seq == 1:
            d.control.set_override(b.kid("pwm1"), 90.0, 2.5)
        return False

    layers = []
    await d.run(max_ticks=6, until=lambda: operate() or layers.append(
        d.hub.latest.decisions[b.kid("pwm1")].layer) and False)
    # set just after tick 1 (t0) for 2.5 s: ticks at t0+1 and t0+2 see it, t0+3 does not
    assert layers == [Layer.POLICY, Layer.OVERRIDE, Layer.OVERRIDE, Layer.POLICY, Layer.POLICY, Layer.POLICY]


async def test_unknown_policy_on_start_is_exit_78(settings, clock):
    d = make(settings.replace(**{"policy": "nope", "policy_pinned": True}), clock, FakeBackend())
    assert await d.run(max_ticks=1) == 78  # EX_CONFIG: systemd does not restart into it


async def test_set_active_policy_unknown_raises(settings, clock):
    d = make(settings, clock, FakeBackend())
    errors = []

    def operate():
        try:
            d.control.set_active_policy("nope")
        except UnknownPolicy as exc:
            errors.append(str(exc))
        return True

    await d.run(max_ticks=2, until=operate)
    assert errors and "known: balanced, handsoff, quiet" in errors[0]


class _WarmingUp(FakeBackend):
    """temp1 is a derived value (like RAPL power): stale on its first read, then fresh, then stale again
    on the fourth read (a real staleness)."""

    def sample(self):
        s = super().sample()
        from aithermd.model import Reading, Sample, Status
        cid = self.kid("temp1")
        if self.samples in (1, 4):
            readings = dict(s.readings)
            readings[cid] = Reading(cid, None, Status.STALE, "first read: needs two")
            return Sample(s.t, readings, s.knobs)
        return s


async def test_a_first_stale_read_is_warming_up_not_a_fault(settings, clock):
    b = _WarmingUp()
    d = make(settings, clock, b)
    degraded = []
    await d.run(max_ticks=4, until=lambda: degraded.append(d.hub.latest.degraded) and False)
    faults = [e for e in d.hub.recent_events() if e.kind == "fault"]
    assert degraded[0] == () and degraded[1] == ()
    assert b.kid("temp1") in degraded[3]
    assert [e.subject for e in faults] == [b.kid("temp1")]


async def test_a_broken_unused_policy_file_does_not_stop_the_start(settings, clock, policy_dir, capsys):
    """One broken file beside the active policy: the daemon starts with the valid ones and says which file
    it left out (error level); a reload still refuses the set while the file is broken."""
    (policy_dir / "typo.yaml").write_text("description: [unclosed\n")
    d = make(settings, clock, FakeBackend())
    reloads = []

    def reload_once():
        if not reloads:
            try:
                d.reload_now()
                reloads.append("accepted")
            except Exception as exc:  # noqa: BLE001
                reloads.append(type(exc).__name__)
        return False

    assert await d.run(max_ticks=2, until=reload_once) == 0
    assert d.hub.latest.policy.active == "balanced"
    skipped = [json.loads(line) for line in capsys.readouterr().err.splitlines()
               if '"policy_skipped"' in line]
    assert len(skipped) == 1 and skipped[0]["path"].endswith("typo.yaml") and skipped[0]["level"] == "error"
    assert reloads == ["PolicyErrors"]


async def test_a_broken_active_policy_still_stops_the_start(settings, clock, policy_dir):
    (policy_dir / "balanced.yaml").write_text("description: [unclosed\n")
    assert await make(settings, clock, FakeBackend()).run(max_ticks=1) == 78
