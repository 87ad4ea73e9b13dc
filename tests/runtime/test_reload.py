"""Reload (SIGHUP / D-Bus Reload): all-or-nothing; a broken file keeps the old policies and logs FILE:LINE;
a reload that would leave the daemon without any policy to run is refused."""

from __future__ import annotations

import threading
import time

import pytest
from structlog.testing import capture_logs

from aithermd.errors import PolicyErrors
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE, write_policy


def stub_daemon(settings, clock) -> tuple[FakeBackend, Daemon]:
    """A fake chip and a daemon on it with the stub engine (each policy a fixed duty), on the fake clock."""
    b = FakeBackend()
    return b, Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)


def pwm1_duty(d: Daemon, b: FakeBackend) -> float | None:
    """The duty (%) decided for the chip's pwm1 in the latest snapshot."""
    return d.hub.latest.decisions[b.kid("pwm1")].value


async def test_a_broken_file_keeps_every_old_policy_and_logs_file_line(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)
    quiet = policy_dir / "quiet.yaml"
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, sorted(d.world.policies), pwm1_duty(d, b)))
        if seq == 1:
            write_policy(policy_dir, "turbo", 90.0)
            quiet.write_text("description: now broken\nduty_pct: fast\n")
            d.request_reload()  # what the SIGHUP handler does
        if seq == 3:
            d.control.set_active_policy("quiet")
        return False

    with capture_logs() as logs:
        assert await d.run(max_ticks=4, until=step) == 0
    assert seen[1][1] == ["balanced", "handsoff", "quiet"]  # turbo not loaded: all-or-nothing
    assert seen[3][2] == 30.0  # the old quiet policy still works
    errors = [e for e in logs if e["event"] == "reload_failed"]
    assert len(errors) == 1 and errors[0]["error"].startswith(f"{quiet}:2:11: error: duty_pct: not a number")
    assert errors[0]["line"] == 2


async def test_a_good_reload_is_swapped_in_between_ticks(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, pwm1_duty(d, b)))
        if seq == 1:
            write_policy(policy_dir, "balanced", 70.0)
            d.request_reload()
        return False

    await d.run(max_ticks=3, until=step)
    assert seen == [(1, 60.0), (2, 70.0), (3, 70.0)]


async def test_reloads_piled_up_between_ticks_are_loaded_once(settings, clock, policy_dir):
    """attack10 S1: every SIGHUP was a full load inside the tick; 3000 of them stalled the loop 8 s. Those
    that came between two ticks are one load, of the files as they are at that tick, and the policy is in
    force."""
    b, d = stub_daemon(settings, clock)
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, pwm1_duty(d, b)))
        if seq == 1:
            for duty in range(21, 71):  # 50 SIGHUPs, each after an edit
                write_policy(policy_dir, "balanced", float(duty))
                d.request_reload()
        return False

    with capture_logs() as logs:
        await d.run(max_ticks=3, until=step)
    assert seen == [(1, 60.0), (2, 70.0), (3, 70.0)]
    assert [e["event"] for e in logs if e["event"].startswith("reload")] == ["reload", "reloads_coalesced"]
    assert next(e for e in logs if e["event"] == "reloads_coalesced")["superseded"] == 49


async def test_a_refused_sighup_reload_keeps_the_dbus_set_loaded_before_it_in_the_same_tick(settings, clock,
                                                                                            policy_dir):
    """attack12 RC1: a D-Bus Reload (its set loaded, the caller told "ok"), then in the same tick a SIGHUP
    whose load is refused (a file broken meanwhile). Coalescing kept only the last of the two and dropped
    the D-Bus set with the refused load. Each kind is coalesced on its own: the D-Bus set is in force."""
    b, d = stub_daemon(settings, clock)
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, pwm1_duty(d, b)))
        if seq == 1:
            write_policy(policy_dir, "balanced", 70.0)
            d.control.reload()  # D-Bus: loaded and posted
            (policy_dir / "quiet.yaml").write_text("description: now broken\nduty_pct: fast\n")
            d.request_reload()  # SIGHUP: refused at the next tick
        return False

    with capture_logs() as logs:
        await d.run(max_ticks=3, until=step)
    assert seen == [(1, 60.0), (2, 70.0), (3, 70.0)]
    assert [e["event"] for e in logs if e["event"] == "reload_refused"] == ["reload_refused"]


async def test_of_two_dbus_reloads_at_once_the_one_loaded_last_is_in_force(settings, clock, policy_dir):
    """attack10: two D-Bus Reload calls run on two worker threads. The first, slow to load, read the files
    before an edit; the second read them after it. Each posts its set when loaded, so the slow one's older
    set came last and stayed in force. Loads are now one at a time, posted in the order they were made."""
    b, d = stub_daemon(settings, clock)
    go, first, seen = threading.Event(), [], []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, pwm1_duty(d, b)))
        if seq == 1:
            load = d.changes.load_policies

            def slow_first(current):
                loaded = load(current)
                if not first:
                    first.append(loaded)
                    go.wait(10)  # the first caller still loading (a parser child on a loaded machine)
                return loaded

            d.changes.load_policies = slow_first
            write_policy(policy_dir, "balanced", 70.0)
            slow = threading.Thread(target=d.control.reload)
            slow.start()
            while not first:
                time.sleep(0.001)
            write_policy(policy_dir, "balanced", 80.0)  # edited again, then reloaded again
            fast = threading.Thread(target=d.control.reload)
            fast.start()
            fast.join(0.2)  # without the lock it loads and posts at once
            go.set()
            slow.join(10)
            fast.join(10)
        return False

    await d.run(max_ticks=3, until=step)
    assert seen == [(1, 60.0), (2, 80.0), (3, 80.0)]


async def test_dbus_reload_raises_and_changes_nothing(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)
    raised = []

    def step():
        if d.hub.latest.seq == 1:
            (policy_dir / "bad.yaml").write_text("description: x\n")
            with pytest.raises(PolicyErrors) as info:
                d.control.reload()
            raised.append(str(info.value))
        return False

    await d.run(max_ticks=2, until=step)
    assert raised and "bad.yaml:1:1: error: duty_pct: missing" in raised[0]
    assert sorted(d.world.policies) == ["balanced", "handsoff", "quiet"]


async def test_dropping_the_active_policy_falls_back_and_ends_its_holds(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)

    def step():
        seq = d.hub.latest.seq
        if seq == 1:
            d.control.set_active_policy("quiet")
            d.control.hold_policy("handsoff", "test", 0, ":1.5", 0, False)
        if seq == 2:
            (policy_dir / "quiet.yaml").unlink()
            (policy_dir / "handsoff.yaml").unlink()
            d.request_reload()
        return False

    await d.run(max_ticks=3, until=step)
    snap = d.hub.latest
    assert snap.policy.active == "balanced" and snap.policy.holds == ()
    assert snap.decisions[b.kid("pwm1")].value == 60.0

async def test_removing_the_active_and_configured_policy_is_refused(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)
    balanced = policy_dir / "balanced.yaml"
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, d.hub.latest.policy.active, pwm1_duty(d, b)))
        if seq == 1:
            assert settings.policy == "balanced" and d.control.active == "balanced"
            balanced.unlink()  # the admin removes the one policy that is active and configured
            d.request_reload()
        return False

    with capture_logs() as logs:
        assert await d.run(max_ticks=3, until=step) == 0
    assert seen == [(1, "balanced", 60.0), (2, "balanced", 60.0), (3, "balanced", 60.0)]
    assert sorted(d.world.policies) == ["balanced", "handsoff", "quiet"]
    failed = [e for e in logs if e["event"] == "reload_failed"]
    assert [e["error"] for e in failed] == [
        f"{balanced}: error: policy balanced would be gone: the daemon would have no policy to run "
        "(hint: put the file back, or first make another policy active (aithermctl policy set NAME))"]
    assert not any(e["event"] == "fault" and "not loaded" in e.get("message", "") for e in logs)


async def test_dbus_reload_without_the_active_policy_raises(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)
    raised = []

    def step():
        if d.hub.latest.seq == 1:
            (policy_dir / "balanced.yaml").unlink()
            with pytest.raises(PolicyErrors) as info:
                d.control.reload()
            raised.append(str(info.value))
        return False

    await d.run(max_ticks=2, until=step)
    assert raised and "policy balanced would be gone" in raised[0]
    assert d.hub.latest.policy.active == "balanced"


async def test_removing_the_active_policy_still_falls_back_to_the_configured_one(settings, clock, policy_dir):
    b, d = stub_daemon(settings, clock)

    def step():
        seq = d.hub.latest.seq
        if seq == 1:
            d.control.set_active_policy("quiet")
        if seq == 2:
            (policy_dir / "quiet.yaml").unlink()
            d.request_reload()
        return False

    await d.run(max_ticks=3, until=step)
    assert d.hub.latest.policy.active == "balanced" and sorted(d.world.policies) == ["balanced", "handsoff"]


async def test_a_reload_reports_no_rapl_fault_and_keeps_the_power_reading(settings, clock, tmp_path):
    """A reload probes the RAPL zones again (a new zone object each time): its power was 'stale: first
    energy read' after every reload, a fault event and a degraded channel for a tick."""
    from aithermd.backends.powercap import RaplBackend
    from aithermd.model import Status
    from aithermd.sim import ttar
    from tests.backends.helpers import TTAR

    ttar.extract(TTAR / "node-exporter-sys-class-powercap-intel-rapl.ttar", tmp_path)
    energy = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    rapl = RaplBackend(str(tmp_path / "sys"), clock=clock)
    d = Daemon(settings, clock=clock, backends=[FakeBackend(), rapl], sleep=clock.sleep, engine=STUB_ENGINE)
    events, power = [], []
    d.hub.add_listener(lambda snap, evs: events.extend(evs))
    uj = [1_000_000]

    def step():
        snap = d.hub.latest
        power.append((snap.seq, snap.readings["powercap:package-0/power"].status,
                      snap.readings["powercap:package-0/power"].value, "powercap:package-0/power" in snap.degraded))
        if snap.seq in (2, 4):
            d.request_reload()
        uj[0] += 30_000_000  # 30 W at the 1 s tick
        energy.write_text(f"{uj[0]}\n")
        return False

    energy.write_text(f"{uj[0]}\n")
    assert await d.run(max_ticks=6, until=step) == 0
    assert [e for e in events if e.kind == "fault"] == []
    assert power[0][1] == Status.STALE  # the very first read: warming up, not a fault
    assert [(seq, status, round(value or 0, 3), degraded) for seq, status, value, degraded in power[1:]] == [
        (seq, Status.OK, 30.0, False) for seq in range(2, 7)]
