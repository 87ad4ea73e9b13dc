"""The operator's side: policies, holds with timeouts and owners, overrides with expiry, explain,
persistence in the state directory."""

from __future__ import annotations

import json

import pytest

from aithermd.errors import InvalidArgument, OutOfRange, UnknownCookie, UnknownKnob, UnknownPolicy
from aithermd.model import Decision, Knob, KnobKind, Layer, Snapshot
from aithermd.publish.hub import StateHub
from aithermd.runtime.control import STATE_FILE, Control
from tests.support.stub_engine import load_policies, write_policy

KNOBS = {
    "hwmon:nct/pwm1": Knob("hwmon:nct/pwm1", "hwmon:nct", KnobKind.PWM, "%", 0.0, 100.0, None, True),
    "gpu0/power_limit": Knob("gpu0/power_limit", "gpu0", KnobKind.POWER_LIMIT, "W", 150.0, 450.0, 450.0,
                             True),
    "gpu0/fan0": Knob("gpu0/fan0", "gpu0", KnobKind.FAN, "%", 30.0, 100.0, None, False, "NO_PERMISSION"),
}


@pytest.fixture
def policies(tmp_path):
    d = tmp_path / "p"
    write_policy(d, "balanced", 60.0)
    write_policy(d, "quiet", 30.0)
    return load_policies([d])


def make(tmp_path, clock, policies, hub=None, **kw):
    return Control(tmp_path / "state", clock=clock, hub=hub or StateHub(), policies=lambda: policies,
                    knobs=lambda: KNOBS, reload=lambda: None, default_policy="balanced", **kw)


def test_list_and_get_policies(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    listed = op.list_policies()
    assert [p["name"] for p in listed] == ["balanced", "quiet"]
    assert listed[0]["active"] and not listed[1]["active"]
    assert listed[1]["description"] == "quiet test policy" and listed[1]["path"].endswith("quiet.yaml")
    got = op.get_policy("quiet")
    assert got["source"] == (tmp_path / "p" / "quiet.yaml").read_text()
    with pytest.raises(UnknownPolicy):
        op.get_policy("nope")


def test_the_active_policy_is_kept_unless_pinned(tmp_path, clock, policies):
    make(tmp_path, clock, policies).set_active_policy("quiet")
    assert json.loads((tmp_path / "state" / STATE_FILE).read_text())["active_policy"] == "quiet"
    assert make(tmp_path, clock, policies).active == "quiet"
    assert make(tmp_path, clock, policies, pinned=True).active == "balanced"


def test_hold_cookies_of_two_daemon_runs_do_not_collide(tmp_path, clock, policies):
    """Cookies counted from 1 at every start: a client still holding cookie 1 of the daemon before a
    restart released another user's new hold 1 when its command ended."""
    first = {make(tmp_path / f"a{i}", clock, policies).hold_policy("quiet", "job", 0.0, ":1.7", 0, False)
             for i in range(20)}
    assert len(first) == 20 and all(1 <= c <= 2**32 - 1 for c in first)


def test_holds_stack_time_out_and_end_with_their_owner(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    a = op.hold_policy("quiet", "batch job", 10.0, ":1.7", 1000, False)
    b = op.hold_policy("balanced", "interactive", 0.0, ":1.8", 1000, False)
    c = op.hold_policy("quiet", "slurm", 0.0, "detached", 0, True)
    assert len({a, b, c}) == 3 and 0 not in {a, b, c}
    assert op.hold_names() == ["quiet", "balanced", "quiet"]
    op.expire(clock.wall())  # drain the queued events
    clock.advance(10.0)
    events = op.expire(clock.wall())
    assert [e.data["cookie"] for e in events] == [a]
    op.release_owner(":1.8")
    assert [h.cookie for h in op.holds] == [c]  # detached holds outlive their caller
    op.release_owner("detached")
    assert [h.cookie for h in op.holds] == [c]
    with pytest.raises(UnknownCookie):
        op.release_policy(a)
    with pytest.raises(UnknownPolicy):
        op.hold_policy("nope", "", 0, ":1.9", None, False)
    with pytest.raises(InvalidArgument):
        op.hold_policy("quiet", "", -1, ":1.9", None, False)


def test_holds_are_bounded_per_uid_and_in_all(tmp_path, clock, policies):
    """An active seat user may hold without a password: 2000 detached holds made operator.json 2.4 MB,
    rewritten at each one, and came back at every start."""
    from aithermd.errors import LimitExceeded
    from aithermd.runtime.control import MAX_HOLDS, MAX_HOLDS_PER_UID

    op = make(tmp_path, clock, policies)
    mine = [op.hold_policy("quiet", f"job {i}", 0, "detached", 1000, True) for i in range(MAX_HOLDS_PER_UID)]
    with pytest.raises(LimitExceeded, match="uid 1000 has 8 holds already; release one first"):
        op.hold_policy("quiet", "one more", 0, "detached", 1000, True)
    op.release_policy(mine[0], by=1000)
    op.hold_policy("quiet", "after a release", 0, "detached", 1000, True)
    for i in range(MAX_HOLDS - MAX_HOLDS_PER_UID):  # other users, and root, fill the rest
        op.hold_policy("quiet", "", 0, "detached", 2000 + i // MAX_HOLDS_PER_UID, True, root=i % 2 == 0)
    with pytest.raises(LimitExceeded, match="64 holds are in force already"):
        op.hold_policy("quiet", "one more user", 0, "detached", 4242, True)
    op.hold_policy("quiet", "root is bound by neither", 0, "detached", 0, True, root=True)
    assert len(op.holds) == MAX_HOLDS + 1 == len(make(tmp_path, clock, policies).holds)


def test_a_state_file_from_before_the_bounds_brings_back_no_more_holds_than_they_allow(tmp_path, clock,
                                                                                       policies):
    """2000 detached holds of one seat user, kept by an older daemon, came back in full after the upgrade
    (and locked root out of the total). Root's own come back whatever their number."""
    from aithermd.runtime.control import MAX_HOLDS_PER_UID

    (tmp_path / "state").mkdir()
    holds = [{"cookie": 10 + i, "policy": "quiet", "reason": "", "owner": "detached", "uid": 65534,
              "created": clock.wall(), "expires": None, "detached": True} for i in range(2000)]
    holds += [{**h, "cookie": 5000 + i, "uid": 0} for i, h in enumerate(holds[:70])]
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps({"active_policy": "balanced", "holds": holds}))
    op = make(tmp_path, clock, policies)
    assert [h.cookie for h in op.holds if h.uid == 65534] == list(range(10, 10 + MAX_HOLDS_PER_UID))
    assert len([h for h in op.holds if h.uid == 0]) == 70


def test_a_new_run_hands_out_none_of_the_last_runs_cookies(tmp_path, clock, policies):
    """With a detached hold kept, the next run counted on from it: the cookies the last run's callers had
    (gone with it) were handed out again, and a stale `aithermctl run` released someone else's hold."""
    first = make(tmp_path, clock, policies)
    kept = first.hold_policy("quiet", "kept", 0, "detached", 0, True)
    gone = [first.hold_policy("quiet", "a caller's", 0, f":1.{i}", 1000, False) for i in range(5)]
    again = make(tmp_path, clock, policies)
    new = [again.hold_policy("quiet", "new", 0, f":2.{i}", 1000, False) for i in range(5)]
    assert kept not in new and not set(gone) & set(new)
    assert new != [kept + 1 + i for i in range(5)]


def test_a_release_says_who_released(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    cookie = op.hold_policy("quiet", "overnight", 0, "detached", 0, True)
    op.expire(clock.wall())
    op.release_policy(cookie, by=1000)
    (event,) = op.expire(clock.wall())
    assert event.message == f"hold {cookie} on quiet released by uid 1000"
    assert event.data == {"cookie": cookie, "by_uid": 1000}


def test_detached_holds_persist_and_caller_holds_do_not(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    op.hold_policy("quiet", "caller", 0, ":1.7", 1000, False)
    kept = op.hold_policy("quiet", "epilog ends it", 3600, "detached", 0, True)
    again = make(tmp_path, clock, policies)
    assert [(h.cookie, h.reason, h.detached) for h in again.holds] == [(kept, "epilog ends it", True)]
    assert again.hold_policy("balanced", "", 0, ":1.1", None, False) != kept
    again.release_policy(kept)
    assert make(tmp_path, clock, policies).holds == []


def test_overrides_are_validated_expire_and_persist(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    with pytest.raises(UnknownKnob):
        op.set_override("hwmon:nct/pwm9", 50, 0)
    with pytest.raises(OutOfRange, match=r"outside 150–450 W"):
        op.set_override("gpu0/power_limit", 500, 0)
    assert op.set_override("gpu0/power_limit", 470, 0) == 450.0  # just outside: clamped, not refused
    with pytest.raises(InvalidArgument, match="read-only: NO_PERMISSION"):
        op.set_override("gpu0/fan0", 50, 0)
    with pytest.raises(InvalidArgument):
        op.set_override("hwmon:nct/pwm1", float("nan"), 0)
    op.set_override("hwmon:nct/pwm1", 80, 30)
    op.set_override("gpu0/power_limit", 300, 0)
    assert op.override_values() == {"hwmon:nct/pwm1": 80.0, "gpu0/power_limit": 300.0}
    assert make(tmp_path, clock, policies).override_values() == op.override_values()
    clock.advance(30)
    op.expire(clock.wall())
    assert op.override_values() == {"gpu0/power_limit": 300.0}
    op.clear_override("gpu0/power_limit")
    assert make(tmp_path, clock, policies).override_values() == {}
    with pytest.raises(UnknownKnob):
        op.clear_override("nope")


def test_explain_reads_the_published_decisions(tmp_path, clock, policies):
    hub = StateHub()
    op = make(tmp_path, clock, policies, hub=hub)
    assert op.explain("") == {}
    d = Decision("hwmon:nct/pwm1", 45.0, Layer.POLICY, "balanced/board-fans", "Tctl 52 °C on the curve",
                 requested=45.0, inputs={"Tctl": 52.0})
    hub.publish(Snapshot(1, 0.0, 0.0, decisions={d.knob_id: d}))
    assert op.explain("hwmon:nct/pwm1") == {"hwmon:nct/pwm1": {
        "value": 45.0, "requested": 45.0, "layer": "policy", "rule": "balanced/board-fans",
        "reason": "Tctl 52 °C on the curve", "inputs": {"Tctl": 52.0}}}
    assert op.explain("gpu0/power_limit") == {}
    with pytest.raises(UnknownKnob):
        op.explain("nope")


def test_an_unreadable_state_file_is_a_warning(tmp_path, clock, policies):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text("{broken")
    op = make(tmp_path, clock, policies)
    assert op.active == "balanced" and op.holds == [] and op.override_values() == {}


def test_a_jobs_progress_rate_is_a_reading_while_it_is_fresh(tmp_path, clock, policies):
    op = make(tmp_path, clock, policies)
    op.report_progress(["gpu0"], 3.25)
    (reading,) = op.progress_readings(clock.monotonic()).values()
    assert (reading.channel_id, reading.value) == ("gpu0/progress_rate", 3.25)
    clock.advance(29.0)
    assert "gpu0/progress_rate" in op.progress_readings(clock.monotonic())
    clock.advance(2.0)  # the job stopped reporting: no reading, the search falls back to what NVML shows
    assert op.progress_readings(clock.monotonic()) == {}
    for gpus, rate in ((["gpu1"], 1.0), (["hwmon:nct"], 1.0), ([], 1.0), (["gpu0"], -1.0),
                       (["gpu0"], float("nan")), (["gpu0"], float("inf"))):
        with pytest.raises(InvalidArgument):
            op.report_progress(gpus, rate)
    assert op.progress_readings(clock.monotonic()) == {}
    with pytest.raises(InvalidArgument, match="name at most 64"):
        op.report_progress([f"gpu{i}" for i in range(10_000)], 1.0)
    with pytest.raises(InvalidArgument) as exc:  # a caller's garbage is not echoed back whole
        op.report_progress(["x" * 100_000, *(f"nope{i}" for i in range(10))], 1.0)
    assert len(str(exc.value)) < 300 and "and 7 more" in str(exc.value)


def test_an_override_that_stops_a_fan_for_good_says_so():
    from aithermd.model import FanCalibration, Knob, KnobKind
    from aithermd.runtime.control import override_warnings

    pwm = Knob("hwmon:nct/pwm2", "hwmon:nct", KnobKind.PWM, "%", 0.0, 100.0, writable=True,
               fan=FanCalibration(tachs=("hwmon:nct/fan2",), start_pct=32.0, stop_pct=24.0, calibrated=True))
    (warning,) = override_warnings(pwm, 20.0, 0.0)  # under the duty that keeps it turning
    assert warning.startswith("hwmon:nct/pwm2 at 20 %, under the 24 % that keeps it turning, with no end: its "
                              "fan stays stopped until `aithermctl override clear hwmon:nct/pwm2`")
    assert len(override_warnings(pwm, 0.0, 0.0)) == 1
    assert override_warnings(pwm, 24.0, 0.0) == [] and override_warnings(pwm, 0.0, 300.0) == []
    limit = Knob("gpu0/power_limit", "gpu0", KnobKind.POWER_LIMIT, "W", 0.0, 600.0, writable=True)
    assert override_warnings(limit, 0.0, 0.0) == []


def test_a_change_meant_to_outlive_a_restart_is_refused_when_it_cannot_be_saved(tmp_path, clock, policies,
                                                                                  monkeypatch):
    """The state directory remounted read-only (ext4 errors=remount-ro): a detached hold, an override and
    a policy switch answered success, then vanished at the next start. Now they are refused, nothing
    changed; what needs no saving (a caller's own hold, a release) still works."""
    import errno

    from aithermd.errors import StateNotSaved
    from aithermd.runtime import control as control_module

    op = make(tmp_path, clock, policies)
    kept = op.hold_policy("quiet", "saved before", 0, "detached", 0, True)
    op.expire(clock.wall())

    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(control_module, "write_atomically", read_only)
    with pytest.raises(StateNotSaved, match="Read-only file system; nothing changed"):
        op.hold_policy("quiet", "overnight", 0, "detached", 0, True)
    with pytest.raises(StateNotSaved):
        op.set_active_policy("quiet")
    with pytest.raises(StateNotSaved):
        op.set_override("hwmon:nct/pwm1", 40.0, 0.0)
    assert (op.active, op.overrides, [h.cookie for h in op.holds]) == ("balanced", {}, [kept])
    assert op.expire(clock.wall()) == []  # no event for what did not happen
    assert op.set_override("hwmon:nct/pwm1", 100.0, 60.0) == 100.0  # for a minute: in force now, unsaved
    mine = op.hold_policy("quiet", "while my job runs", 0, ":1.9", 1000, False)
    with pytest.raises(StateNotSaved):  # released unsaved, it came back at the next start
        op.release_policy(kept)
    assert [h.cookie for h in op.holds] == [kept, mine]
    op.release_policy(mine)  # a caller's own hold is not saved: released
    assert [h.cookie for h in op.holds] == [kept]
    from aithermd.publish import wire
    from aithermd.publish.dbus_control import dbus_error

    with pytest.raises(StateNotSaved) as refused:
        op.set_active_policy("quiet")
    assert dbus_error(refused.value).type == wire.ERROR_STATE_NOT_SAVED  # a named error, not Failed
