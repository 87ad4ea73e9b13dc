"""The CLI as a process, over a private bus, against the scripted daemon: text and --json output, exit codes,
one-line errors, and holds that end however the command ends."""

import asyncio
import json
import os
import signal

import pytest
from cli_helpers import ctl, finish, start
from fake_client import load

from aithermd.publish import wire


async def test_status_json_is_exactly_the_daemon_document(fake_daemon, private_bus):
    rc, out, err = await ctl(private_bus, "status", "--json")
    assert rc == 0 and err == ""
    assert out == json.dumps(fake_daemon.doc, ensure_ascii=False) + "\n"
    assert json.loads(out) == fake_daemon.doc


async def test_status_text_summarises_gpus_packages_fans(fake_daemon, private_bus):
    rc, out, _ = await ctl(private_bus, "status")
    assert rc == 0
    assert out.splitlines()[0] == "policy ai-training"  # the scripted daemon starts without holds
    assert "  gpu0  NVIDIA GeForce RTX 4090" in out
    assert ("     54 °C  power 358.2 W of limit 360 W (10–600 W, default 450 W)  util 100%  fans 34%"
            in out)
    assert "limit set by quiet/busy-limit: gpu0 in load.busy: 80% of the default (360 W)" in out
    assert "clock events: sw_power_cap" in out
    assert "package-0  power   70.1 W  PL1 95 W  PL2 119 W  50 °C" in out
    assert "nct6798-isa-0290 fan1   494 RPM  duty  27%  quiet/board-fans" in out


async def test_policy_verbs(fake_daemon, private_bus):
    rc, out, _ = await ctl(private_bus, "policy", "list")
    assert rc == 0 and out.splitlines()[0].startswith("* ai-training  Sustained GPU load (20 s) raises")
    rc, out, _ = await ctl(private_bus, "policy", "list", "--json")
    assert [p["name"] for p in json.loads(out)] == ["ai-training", "balanced", "quiet", "workstation"]
    rc, out, _ = await ctl(private_bus, "policy", "show", "quiet")
    assert rc == 0 and out.startswith("# quiet — /usr/share/aithermd/policies/quiet.yaml\n")
    assert "limit: 80%" in out  # the shipped source, as GetPolicy sends it
    rc, _, err = await ctl(private_bus, "policy", "set", "balanced")
    assert rc == 0 and "active policy is now balanced" in err
    assert fake_daemon.doc["policy"]["active"] == "balanced"
    rc, _, err = await ctl(private_bus, "policy", "set", "turbo")
    assert rc == wire.EXIT_USAGE
    assert err == "aithermctl: no policy 'turbo' (policies: aithermctl policy list)\n"
    fake_daemon.reload_error = "/etc/aithermd/policies/x.yaml:3: unknown key 'rulez'"
    rc, _, err = await ctl(private_bus, "policy", "reload")
    assert rc == wire.EXIT_FAILURE and "x.yaml:3: unknown key 'rulez'" in err and err.count("\n") == 1


async def test_a_reload_that_drops_a_held_policy_says_the_hold_ends(fake_daemon, private_bus):
    """An admin's overnight hold ended because someone tidied the policy directory, and the reload said
    plain "policies reloaded"."""
    rc, out, _ = await ctl(private_bus, "hold", "quiet", "--reason", "overnight", "--detach")
    cookie = int(out)
    fake_daemon.policies = [p for p in fake_daemon.policies if p["name"] != "quiet"]  # quiet.yaml removed
    rc, _, err = await ctl(private_bus, "policy", "reload")
    assert rc == 0 and err.splitlines() == [
        "aithermctl: policies reloaded",
        f"aithermctl: warning: hold {cookie} on quiet ends: that policy is gone (put its file back and hold "
        "it again to keep it)"]
    fake_daemon.policies = [p for p in fake_daemon.policies if p["name"] != "ai-training"]  # the active one
    rc, _, err = await ctl(private_bus, "policy", "reload")
    assert "warning: the active policy ai-training is gone: aithermd falls back to its configured one" in err


async def test_hold_detached_prints_the_cookie_and_release_ends_it(fake_daemon, private_bus):
    rc, out, _ = await ctl(private_bus, "hold", "quiet", "--reason", "meeting", "--timeout", "15m",
                           "--detach")
    cookie = int(out)
    assert rc == 0 and fake_daemon.holds[0]["cookie"] == cookie
    assert fake_daemon.calls[-1][:2] == ("HoldPolicy", ["quiet", "meeting", 900.0, True])
    rc, out, err = await ctl(private_bus, "release", str(cookie))
    assert rc == 0 and fake_daemon.holds == []
    assert (out, err) == ("", f"aithermctl: hold {cookie} released\n")  # it said nothing (newuser8)
    rc, _, err = await ctl(private_bus, "release", str(cookie))
    assert rc == wire.EXIT_USAGE and f"no hold with cookie {cookie}" in err
    assert err.endswith("(holds: aithermctl status)\n")  # where holds are listed


@pytest.mark.parametrize("argv", [("policy", "set", "balancd"), ("policy", "show", "balancd"),
                                  ("hold", "balancd", "--reason", "r", "--detach"),
                                  ("run", "--policy", "balancd", "--", "true")])
async def test_a_misspelt_policy_name_gets_a_did_you_mean(fake_daemon, private_bus, argv):
    """newuser8: `policy set balancd` said "no policy 'balancd'; known: ..." with no hint, as check gives."""
    rc, _, err = await ctl(private_bus, *argv)
    assert rc == wire.EXIT_USAGE
    assert "no policy 'balancd'" in err.splitlines()[0]
    assert err.splitlines()[0].endswith("(hint: did you mean 'balanced'?)")
    assert fake_daemon.holds == []


async def test_a_policy_name_nothing_resembles_gets_no_hint(fake_daemon, private_bus):
    rc, _, err = await ctl(private_bus, "policy", "set", "zzzz")
    assert rc == wire.EXIT_USAGE and "no policy 'zzzz'" in err and "did you mean" not in err


async def test_release_of_a_number_that_is_no_cookie_is_a_usage_error(fake_daemon, private_bus):
    for bad in ("-1", str(2**32), "x7"):  # a cookie is a D-Bus uint32
        rc, out, err = await ctl(private_bus, "release", bad)
        assert (rc, out) == (wire.EXIT_USAGE, "")
        assert f"not a hold cookie: '{bad}'" in err and "Traceback" not in err and "Future" not in err
    assert not [c for c in fake_daemon.calls if c[0] == "ReleasePolicy"]


async def test_hold_without_detach_holds_until_interrupted(fake_daemon, private_bus):
    proc = await start(private_bus, "hold", "quiet", "--reason", "demo")
    cookie = int(await asyncio.wait_for(proc.stdout.readline(), 20))
    assert [h["cookie"] for h in fake_daemon.holds] == [cookie]
    assert fake_daemon.holds[0]["detached"] is False
    await asyncio.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert await finish(proc) == 0
    assert fake_daemon.holds == []
    assert ("ReleasePolicy", [cookie]) in [c[:2] for c in fake_daemon.calls]


async def test_a_hold_ends_when_the_daemon_leaves_but_not_on_a_document_it_cannot_read(fake_daemon,
                                                                                        private_bus):
    fake_daemon.m_GetSnapshot = lambda msg: json.dumps({"seq": 1})  # a daemon of another version
    proc = await start(private_bus, "hold", "quiet", "--reason", "demo")
    int(await asyncio.wait_for(proc.stdout.readline(), 20))
    await asyncio.sleep(0.5)
    assert proc.returncode is None  # an unreadable snapshot is no sign the daemon left
    fake_daemon.stop()
    assert await finish(proc) == wire.EXIT_NOT_RUNNING


async def test_a_hold_someone_else_released_ends_the_holding_aithermctl_with_1(fake_daemon, private_bus):
    """`hold` without --detach waited only for a signal or the daemon's departure: a hold the daemon ended
    (here another caller released it; the scripted daemon sends no Event, so this is the look every 2 s)
    left it "holding" for ever, and its Ctrl-C then failed to release an unknown cookie."""
    proc = await start(private_bus, "hold", "quiet", "--reason", "demo")
    cookie = int(await asyncio.wait_for(proc.stdout.readline(), 20))
    await asyncio.sleep(0.5)
    rc, _, err = await ctl(private_bus, "release", str(cookie))
    assert rc == 0, err
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == wire.EXIT_FAILURE
    assert f"the daemon ended hold {cookie}: it is no longer held" in err.decode()
    releases = [c for c in fake_daemon.calls if c[0] == "ReleasePolicy"]
    assert len(releases) == 1  # the other caller's: aithermctl tried no release of its own


async def test_a_hold_the_daemon_ended_at_its_timeout_exits_0_at_the_event(fake_daemon, private_bus):
    """The daemon drops a hold at its timeout and says so with an Event (kind policy, data.cookie, the
    message aithermd's control writes): `hold --timeout` without --detach returns then, with 0."""
    from aithermd.model import Event
    from aithermd.publish.document import event_document

    proc = await start(private_bus, "hold", "quiet", "--reason", "demo", "--timeout", "1h")
    cookie = int(await asyncio.wait_for(proc.stdout.readline(), 20))
    await asyncio.sleep(0.5)
    fake_daemon.doc["policy"]["holds"] = []
    said = event_document(Event("policy", 0.0, "quiet", f"hold {cookie} on quiet timed out",
                                {"cookie": cookie}))
    await fake_daemon.emit("Event", "ss", ["policy", json.dumps(said)])
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err  # "expired": the event's words (a look alone finds the hold gone)
    assert f"hold {cookie} on quiet expired after 1h 00m (--timeout)" in err.decode()
    assert not [c for c in fake_daemon.calls if c[0] == "ReleasePolicy"]


async def test_run_passes_the_exit_code_and_releases_the_hold(fake_daemon, private_bus):
    rc, out, err = await ctl(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo hi; exit 7")
    assert rc == 7 and out == "hi\n"
    (hold,) = [c for c in fake_daemon.calls if c[0] == "HoldPolicy"]
    assert hold[1] == ["quiet", "aithermctl run sh -c 'echo hi; exit 7'", 0.0, False]
    assert fake_daemon.holds == []
    assert "holding quiet" in err


async def test_run_releases_the_hold_when_the_child_is_killed(fake_daemon, private_bus):
    proc = await start(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo $$; exec sleep 60")
    child = int(await asyncio.wait_for(proc.stdout.readline(), 20))
    assert len(fake_daemon.holds) == 1
    os.kill(child, signal.SIGKILL)
    assert await finish(proc) == 128 + signal.SIGKILL
    assert fake_daemon.holds == []


async def test_run_forwards_sigterm_and_releases(fake_daemon, private_bus):
    proc = await start(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo ready; exec sleep 60")
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    assert await finish(proc) == 128 + signal.SIGTERM
    assert fake_daemon.holds == []


async def test_run_killed_itself_leaves_no_hold_because_it_is_not_detached(fake_daemon, private_bus):
    proc = await start(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo $$; exec sleep 60")
    child = int(await asyncio.wait_for(proc.stdout.readline(), 20))
    try:
        assert fake_daemon.holds[0]["detached"] is False
        proc.kill()  # aithermctl dies: its bus connection closes and the daemon ends the hold
        for _ in range(100):
            if not fake_daemon.holds:
                break
            await asyncio.sleep(0.05)
        assert fake_daemon.holds == []
    finally:
        os.kill(child, signal.SIGKILL)
        await finish(proc)


async def _until(predicate, what: str, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_run_takes_its_hold_again_when_aithermd_restarts(fake_daemon, private_bus):
    """A hold is tied to the daemon instance: after a restart (an upgrade, a crash systemd restarts) the
    job would run on under the plain policy. `run` says so and takes the hold again from the new daemon;
    at the end it releases the new hold, not the dead cookie."""
    from fake_daemon import FakeDaemon

    proc = await start(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo ready; exec sleep 60")
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
    first = fake_daemon.holds[0]
    fake_daemon.stop()
    second = FakeDaemon()
    second._next = 500  # another instance, other cookies
    await second.start(private_bus)
    try:
        await _until(lambda: second.holds, "the hold taken again on the new daemon")
        (hold,) = second.holds
        assert (hold["policy"], hold["reason"], hold["detached"], hold["cookie"]) == (
            "quiet", first["reason"], False, 501)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 128 + signal.SIGTERM
        assert second.holds == []
        assert [c[:2] for c in second.calls if c[0] == "ReleasePolicy"] == [("ReleasePolicy", [501])]
        text = err.decode()
        assert "aithermd left the bus; the hold on quiet ended with it; taking it again" in text
        assert "aithermd is back; holding quiet again (cookie 501)" in text
        assert "releasing hold" not in text  # no release of the dead cookie was tried
    finally:
        second.stop()


async def test_run_takes_its_hold_again_after_the_bus_restarts():
    """`systemctl restart dbus` (a package upgrade) drops every connection; the daemon comes back on the
    new bus and `run` takes its hold again there."""
    from fake_daemon import FakeDaemon

    from tests.support.dbus import PrivateBus

    bus = PrivateBus.start("session")
    daemon = await FakeDaemon().start(bus.address)
    proc = await start(bus.address, "run", "--policy", "quiet", "--", "sh", "-c", "echo ready; exec sleep 60")
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
        assert len(daemon.holds) == 1
        daemon.bus = None  # its connection dies with the bus
        bus.restart()
        daemon = await FakeDaemon().start(bus.address)
        await _until(lambda: daemon.holds, "the hold taken again on the restarted bus")
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 128 + signal.SIGTERM and daemon.holds == []
        assert "aithermd is back; holding quiet again" in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await finish(proc)
        daemon.stop()
        bus.stop()


def _refuse_with(daemon, why: str) -> None:
    if why == "no policy":  # an upgrade dropped it
        daemon.policies = [p for p in daemon.policies if p["name"] != "quiet"]
    else:  # LimitExceeded was taken for a daemon still starting: retried every 2 s for ever, without a word
        from fake_daemon import _Err

        def full(*_args):
            raise _Err(wire.ERROR_LIMIT_EXCEEDED, "64 holds are in force already; release one first")

        daemon.m_HoldPolicy = full


@pytest.mark.parametrize(("why", "said"), [("no policy", "no policy 'quiet'"),
                                           ("too many holds", "64 holds are in force already")])
async def test_run_says_so_when_the_new_daemon_refuses_the_hold(fake_daemon, private_bus, why, said):
    from fake_daemon import FakeDaemon

    proc = await start(private_bus, "run", "--policy", "quiet", "--", "sh", "-c", "echo ready; exec sleep 60")
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
    fake_daemon.stop()
    second = FakeDaemon()
    _refuse_with(second, why)
    await second.start(private_bus)
    try:
        await _until(lambda: any(c[0] == "HoldPolicy" for c in second.calls),
                     "a hold asked of the new daemon")
        await asyncio.sleep(3.0)  # past one more poll: it is not asked again, and the job runs on
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 128 + signal.SIGTERM
        assert f"could not take the hold on quiet again: {said}" in err.decode()
        assert len([c for c in second.calls if c[0] == "HoldPolicy"]) == 1
    finally:
        second.stop()


@pytest.mark.parametrize("ask", [True, False])
async def test_run_refused_by_polkit_says_not_authorized_not_start_aithermd(fake_daemon, private_bus, ask):
    """newuser8 #3: with the daemon running and polkit refusing, `run` told the user to start aithermd."""
    fake_daemon.deny.add("HoldPolicy")
    flags = () if ask else ("--no-ask-password",)
    rc, out, err = await ctl(private_bus, *flags, "run", "--policy", "quiet", "--", "echo", "CMD-RAN")
    assert rc == wire.EXIT_NOT_AUTHORIZED and out == ""
    first, second = err.splitlines()
    assert first.startswith("aithermctl: not authorized to hold a policy: polkit denied HoldPolicy")
    assert second.startswith("aithermctl: run: echo CMD-RAN was not run (quiet could not be held for it); "
                             "you are not authorized to hold quiet: ")
    assert "start aithermd" not in err and "io.github.aithermd.hold-policy for you in polkit" in second
    assert ("leave out --no-ask-password" in second) is (not ask)


@pytest.mark.parametrize("argv, method", [
    (("policy", "set", "quiet"), "SetActivePolicy"), (("policy", "reload"), "Reload"),
    (("hold", "quiet", "--reason", "r", "--detach"), "HoldPolicy"),
    (("hold", "quiet", "--reason", "r"), "HoldPolicy"),
    (("release", "7"), "ReleasePolicy"), (("override", "gpu0/power_limit", "300"), "SetOverride"),
    (("override", "clear", "gpu0/power_limit"), "ClearOverride"), (("gpu", "release", "gpu0"), "ReleaseGpu")])
async def test_every_verb_that_changes_something_says_not_authorized_when_refused(fake_daemon, private_bus,
                                                                                  argv, method):
    fake_daemon.deny.add(method)
    rc, _, err = await ctl(private_bus, *argv)
    assert rc == wire.EXIT_NOT_AUTHORIZED, err
    assert err.startswith("aithermctl: not authorized to ") and "in polkit" in err
    assert "start aithermd" not in err and "not running" not in err and len(err.splitlines()) == 1


async def test_run_of_a_missing_command_is_127_and_releases(fake_daemon, private_bus):
    rc, _, err = await ctl(private_bus, "run", "--policy", "quiet", "--", "no-such-command-here")
    assert rc == 127 and "no-such-command-here: command not found" in err
    assert fake_daemon.holds == []


async def _wait_for_progress(fake_daemon) -> None:
    for _ in range(400):
        if fake_daemon.progress:
            return
        await asyncio.sleep(0.05)


async def test_run_reports_the_progress_the_job_prints_and_passes_its_output(fake_daemon, private_bus,
                                                                             tmp_path):
    go = tmp_path / "go"
    script = (r"printf 'Epoch 0:  41%%| 820/2000 [04:15<06:07,  3.21it/s]\r'; "
              f"while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 3")
    proc = await start(private_bus, "run", "--progress-regex", r"(?P<rate>[\d.]+)it/s", "--progress-gpus",
                       "gpu1", "--", "sh", "-c", script)
    try:
        await _wait_for_progress(fake_daemon)
        assert fake_daemon.progress[0] == (["gpu1"], pytest.approx(3.21))
        assert fake_daemon.holds == []  # no --policy: nothing held
    finally:
        go.touch()
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 3
    assert out == b"Epoch 0:  41%| 820/2000 [04:15<06:07,  3.21it/s]\rdone\n"


async def test_run_reports_for_the_gpus_cuda_names_and_goes_on_when_refused(fake_daemon, private_bus,
                                                                            tmp_path, monkeypatch):
    go = tmp_path / "go"
    uuid = next(d for d in fake_daemon.doc["devices"] if d["id"] == "gpu1")["info"]["uuid"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
    script = f"echo 'step 10 loss 2'; sleep 1.2; echo 'step 20'; while [ ! -e {go} ]; do sleep 0.05; done"
    proc = await start(private_bus, "run", "--policy", "quiet", "--progress-regex", r"step (\d+)", "--",
                       "sh", "-c", script)
    try:
        await _wait_for_progress(fake_daemon)
        gpus, rate = fake_daemon.progress[0]
        assert gpus == ["gpu1"] and 0 < rate <= 10.0  # 10 steps over at least the 1 s a counter needs
    finally:
        go.touch()
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0 and fake_daemon.holds == []

    fake_daemon.deny.add("ReportProgress")
    go.unlink()
    before = len(fake_daemon.calls)
    proc = await start(private_bus, "run", "--progress-regex", r"(?P<rate>[\d.]+)it/s", "--", "sh", "-c",
                       f"echo '2.0it/s'; while [ ! -e {go} ]; do sleep 0.05; done; exit 0")
    try:
        for _ in range(400):
            if any(c[0] == "ReportProgress" for c in fake_daemon.calls[before:]):
                break
            await asyncio.sleep(0.05)
        fake_daemon.deny.discard("ReportProgress")  # allowed again: the next report goes through
        reported = len(fake_daemon.progress)
        for _ in range(400):
            if len(fake_daemon.progress) > reported:
                break
            await asyncio.sleep(0.05)
    finally:
        go.touch()
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
    assert b"progress not reported:" in err and err.count(b"progress not reported") == 1
    assert b"(trying again while the job runs)" in err
    assert err.index(b"progress not reported") < err.index(b"progress reported from now on (gpu1)")


async def test_override_set_clear_and_refusals(fake_daemon, private_bus):
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "400W", "--for", "15m")
    assert rc == 0 and fake_daemon.overrides == {"gpu0/power_limit": (400.0, 900.0)}
    assert "gpu0/power_limit overridden to 400 W for 15m 00s" in err  # the unit, the duration as typed
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "620")  # just above its 600 W max
    assert rc == 0 and fake_daemon.overrides["gpu0/power_limit"] == (600.0, 0.0)
    assert "overridden to 600 W until cleared (asked 620 W: clamped to the knob's range)" in err
    rc, _, _ = await ctl(private_bus, "override", "clear", "gpu0/power_limit")
    assert rc == 0 and fake_daemon.overrides == {}
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "9999")
    assert rc == wire.EXIT_USAGE and err == (
        "aithermctl: gpu0/power_limit: 9999 W is outside 10–600 (limits: aithermctl explain KNOB)\n")
    # '80%' of a power limit is 80 % of its default, as policies read it (it was refused here)
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "80%", "--for", "0")
    assert rc == 0 and fake_daemon.overrides == {"gpu0/power_limit": (360.0, 0.0)}  # --for 0: until cleared
    assert "gpu0/power_limit overridden to 360 W (80 % of the default 450 W) until cleared" in err
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "lots")
    assert rc == wire.EXIT_USAGE and "not a value: 'lots'" in err
    fake_daemon.deny.add("SetOverride")
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "400")
    assert rc == wire.EXIT_NOT_AUTHORIZED
    assert err.startswith("aithermctl: not authorized to override a knob") and err.count("\n") == 1


async def test_explain_gives_a_paragraph_per_knob(fake_daemon, private_bus):
    rc, out, _ = await ctl(private_bus, "explain")
    assert rc == 0
    paragraphs = out.strip().split("\n\n")
    knobs = [k["id"] for d in fake_daemon.doc["devices"] for k in d["knobs"]]
    assert [p.split()[0] for p in paragraphs] == knobs  # every knob, those no rule set included
    limit = " ".join(next(p for p in paragraphs if p.startswith("gpu0/power_limit")).split())
    assert limit == ("gpu0/power_limit is 360 W, set by a held policy (quiet/busy-limit): gpu0 in load.busy: "
                     "80% of the default (360 W). Inputs: gpu.utilization_pct.max_90s 100; "
                     "gpu.utilization_pct.max_90s < 10: 0.0s of 1m 30s; state:load busy. "
                     "Range 10 W to 600 W, default 450 W.")  # busy: no sample below 10 % in the idle window
    fan = " ".join(next(p for p in paragraphs if p.startswith("gpu0/fan0")).split())
    assert fan.startswith("gpu0/fan0 is 34.8%, set by a held policy (quiet/gpu-fans): curve gpu → 35 %. ")
    assert "used:gpu gpu0/temperature" in fan and fan.endswith("Range 0% to 100%.")  # its own GPU's
    pl2 = " ".join(next(p for p in paragraphs if p.startswith("powercap:package-0/pl2")).split())
    assert pl2 == ("powercap:package-0/pl2 is 118.8 W, set by no rule (the value found at start is kept).")
    rc, out, _ = await ctl(private_bus, "explain", "gpu1/power_limit", "--json")
    assert list(json.loads(out)) == ["gpu1/power_limit"]
    rc, _, err = await ctl(private_bus, "explain", "gpu7/fan0")
    assert rc == wire.EXIT_USAGE and "no knob 'gpu7/fan0'" in err


async def test_energy_reports_joules_duration_and_mean_power(fake_daemon, private_bus):
    rc, out, err = await ctl(private_bus, "energy", "--", "sh", "-c", "sleep 0.3; echo done; exit 3")
    assert rc == 3 and out == "done\n"
    lines = err.splitlines()
    assert lines[0].startswith("energy while sh -c 'sleep 0.3; echo done; exit 3' ran")
    gpu0 = next(line for line in lines if line.strip().startswith("gpu0"))
    window = load("energy.json")  # the fake answers the daemon's window, scaled to this one's length
    mean = window["joules"]["gpu0"] / window["duration_s"]
    assert gpu0.split()[2] == "J" and gpu0.endswith(f"{mean:.1f} W mean")
    assert any(line.strip().startswith("all GPUs") for line in lines)
    (start_call,) = [c for c in fake_daemon.calls if c[0] == "StartScopedEnergyWindow"]
    assert start_call[1][:2] == ["sh", 7 * 86400.0]
    kind, _, pid = start_call[1][2].partition(":")  # aithermctl's own pid: the command is in its tree
    assert kind == "pid" and pid.isdigit()
    own = lines[lines.index("its own share (by its processes' GPU utilization and CPU time):") + 1:]
    assert [line.split()[0] for line in own] == ["cpu", "gpu0"]
    rc, out, _ = await ctl(private_bus, "energy", "--json", "--", "true")
    assert rc == 0 and set(json.loads(out)["joules"]) == {"gpu0", "gpu1", "powercap:core", "powercap:package-0"}


async def test_energy_of_a_command_that_cannot_start_prints_no_empty_table(fake_daemon, private_bus):
    """newuser8: `energy -- nosuchcmd` said "command not found", then an empty "energy while nosuchcmd ran,
    0.0s" table. Its window is still closed."""
    rc, out, err = await ctl(private_bus, "energy", "--", "nosuchcmd-cli13")
    assert (rc, out, err) == (127, "", "aithermctl: nosuchcmd-cli13: command not found\n")
    assert [c[0] for c in fake_daemon.calls if "EnergyWindow" in c[0]] == ["StartScopedEnergyWindow",
                                                                         "StopEnergyWindow"]


async def test_energy_stops_its_window_before_the_command_is_reaped(fake_daemon, private_bus):
    """The command has exited but is still in /proc (a zombie) when the window is stopped: the daemon's
    last accounting pass can still tell it was aithermctl's child and charge its last seconds to the window
    (attack8 T6: a 4 s job under ``aithermctl energy`` was charged nothing)."""
    rc, _, _ = await ctl(private_bus, "energy", "--", "sh", "-c", "exit 5")
    assert rc == 5
    assert fake_daemon.children_at_stop == ["Z"]


async def test_doctor_reports_bus_and_daemon(fake_daemon, private_bus, tmp_path):
    gpu1 = next(d for d in fake_daemon.doc["devices"] if d["id"] == "gpu1")
    gpu1["knobs"][1].update(writable=False, why_not="NVML_ERROR_NO_PERMISSION: needs root")  # not root
    rc, out, _ = await ctl(private_bus, "doctor", "--sysfs-root", str(tmp_path))
    assert rc == 0
    assert "ok    bus" in out and "connected to the bus at" in out
    assert "aithermd 0.1.0-fake, policy ai-training, 8 devices" in out
    assert "gpu1/fan0" in out and "read-only: NVML_ERROR_NO_PERMISSION: needs root" in out
    assert "no RAPL zones" in out


async def test_not_running_is_exit_3_with_what_to_do(private_bus):
    rc, out, err = await ctl(private_bus, "status")
    assert (rc, out) == (wire.EXIT_NOT_RUNNING, "")
    assert err == (f"aithermctl: aithermd is not running on the bus at {private_bus} "
                   f"(start it: aithermd run --bus {private_bus})\n")
    rc, out, _ = await ctl(private_bus, "doctor")
    assert rc == wire.EXIT_FAILURE and "FAIL  daemon" in out
    assert "aithermd is not running on the bus at" in out


async def test_usage_errors_are_exit_2(private_bus):
    assert (await ctl(private_bus, "run", "--policy", "quiet"))[0] == wire.EXIT_USAGE
    rc, _, err = await ctl(private_bus, "run", "--", "true")
    assert rc == wire.EXIT_USAGE and "give --policy POLICY, --progress-regex REGEX, or both" in err
    rc, _, err = await ctl(private_bus, "run", "--progress-regex", "it/s", "--", "true")
    assert rc == wire.EXIT_USAGE and "captures nothing" in err
    assert (await ctl(private_bus, "override", "gpu0/power_limit"))[0] == wire.EXIT_USAGE
    rc, _, err = await ctl(private_bus, "hold", "quiet", "--reason", "x", "--timeout", "soon")
    assert rc == wire.EXIT_USAGE and "not a duration: 'soon'" in err


async def test_hold_timeout_0_is_no_end(fake_daemon, private_bus):
    """The daemon's own word for it is "0: no end"; the command line took no 0 before."""
    rc, out, err = await ctl(private_bus, "hold", "quiet", "--reason", "r", "--timeout", "0", "--detach")
    assert rc == 0, err
    assert [(h["policy"], h["expires"], h["detached"]) for h in fake_daemon.holds] == [("quiet", None, True)]


async def test_status_names_a_holds_owner_by_user_and_process(fake_daemon, private_bus):
    """A hold held by a connection read "until :1.2 leaves"; the bus knows its uid and pid."""
    import pwd

    proc = await start(private_bus, "hold", "quiet", "--reason", "demo")
    try:
        await asyncio.wait_for(proc.stdout.readline(), 20)
        rc, out, err = await ctl(private_bus, "status")
        assert rc == 0, err
        user = pwd.getpwuid(os.getuid()).pw_name
        with open(f"/proc/{proc.pid}/comm") as f:
            comm = f.read().strip()
        assert f"(until {user}: {comm} (pid {proc.pid}) leaves)" in out
    finally:
        proc.send_signal(signal.SIGINT)
        await finish(proc)


async def test_gpu_release_prints_what_the_daemon_did(fake_daemon, private_bus):
    rc, _, err = await ctl(private_bus, "gpu", "release", "gpu0")
    assert rc == 0 and fake_daemon.released == ["gpu0"] and "released: originals restored" in err
    rc, _, err = await ctl(private_bus, "gpu", "release", "gpu7")
    assert rc == wire.EXIT_USAGE and "no GPU 'gpu7'" in err
