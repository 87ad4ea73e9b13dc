"""DaemonClient over a real dbus-daemon against the scripted daemon: typed calls, errors mapped to readable
exceptions, the snapshot and event followers, and reconnecting."""

import asyncio
import json

import pytest
from fake_daemon import FakeDaemon

from aithermctl import errors
from aithermctl.client import DaemonClient
from aithermd.publish import wire


async def test_typed_calls_return_decoded_documents(fake_daemon, private_bus):
    async with DaemonClient(private_bus) as c:
        doc = await c.get_snapshot()
        assert [d["id"] for d in doc["devices"] if d["kind"] == "gpu"] == ["gpu0", "gpu1"]
        assert (await c.get_history(300))["knobs"]["gpu0/power_limit"][-1] == 360.0
        assert list(await c.explain("gpu0/power_limit")) == ["gpu0/power_limit"]
        assert [p["name"] for p in await c.list_policies()] == ["ai-training", "balanced", "quiet", "workstation"]
        assert (await c.get_policy("quiet"))["source"].startswith("# quiet — for a desk machine")
        assert await c.get_property("Version") == "0.1.0-fake"
        assert await c.name_has_owner() is True
        window = await c.start_energy_window("epoch", 60)
        result = await c.stop_energy_window(window)
        assert result["name"] == "epoch" and result["id"] == window
        assert set(result["joules"]) == {"gpu0", "gpu1", "powercap:core", "powercap:package-0"}


async def test_changes_reach_the_daemon_with_their_arguments(fake_daemon, private_bus):
    async with DaemonClient(private_bus) as c:
        cookie = await c.hold_policy("quiet", "meeting", 900, detached=True)
        assert [h["cookie"] for h in await c.holds()] == [cookie]
        await c.release_policy(cookie)
        await c.set_override("gpu0/power_limit", 400, 60)
        await c.clear_override("gpu0/power_limit")
        await c.set_active_policy("balanced")
        await c.reload()
    calls = [(name, body) for name, body, _ in fake_daemon.calls]
    assert ("HoldPolicy", ["quiet", "meeting", 900.0, True]) in calls
    assert ("ReleasePolicy", [cookie]) in calls
    assert ("SetOverride", ["gpu0/power_limit", 400.0, 60.0]) in calls
    assert ("ClearOverride", ["gpu0/power_limit"]) in calls
    assert fake_daemon.doc["policy"]["active"] == "balanced"


@pytest.mark.parametrize(("call", "cls", "text"), [
    (lambda c: c.set_override("gpu9/power_limit", 1, 0), errors.Rejected, "no knob 'gpu9/power_limit'"),
    (lambda c: c.set_override("gpu0/power_limit", 9999, 0), errors.Rejected, "9999 W is outside 10–600"),
    (lambda c: c.hold_policy("turbo", "x"), errors.Rejected, "no policy 'turbo' (policies: aithermctl"),
    (lambda c: c.release_policy(4711), errors.Rejected, "no hold with cookie 4711"),
    (lambda c: c.stop_energy_window(4711), errors.Rejected, "no energy window 4711"),
])
async def test_refusals_become_readable_errors(fake_daemon, private_bus, call, cls, text):
    async with DaemonClient(private_bus) as c:
        with pytest.raises(cls) as info:
            await call(c)
    assert text in str(info.value)
    assert info.value.exit_code == wire.EXIT_USAGE


@pytest.mark.parametrize(("call", "text"), [
    (lambda c: c.get_policy("q\udcffuiet"), "GetPolicy: the argument 'q\\xffuiet' is not valid UTF-8"),
    (lambda c: c.hold_policy("quiet", "a\0b"), "HoldPolicy: the argument 'a\\x00b' holds a NUL"),
    (lambda c: c.release_policy(2**32), "ReleasePolicy: the argument 4294967296 is outside 0–4294967295"),
    (lambda c: c.stop_energy_window(-1), "StopEnergyWindow: the argument -1 is outside"),
])
async def test_arguments_dbus_cannot_carry_are_refused_and_the_connection_stays(fake_daemon, private_bus,
                                                                                  call, text):
    async with DaemonClient(private_bus) as c:
        with pytest.raises(errors.Rejected) as info:
            await call(c)
        assert str(info.value).startswith(text) and info.value.exit_code == wire.EXIT_USAGE
        assert c.connected and (await c.get_snapshot())["devices"]  # nothing was half-sent


async def test_not_authorized_names_the_polkit_action(fake_daemon, private_bus):
    fake_daemon.deny.add("SetOverride")
    async with DaemonClient(private_bus) as c:
        with pytest.raises(errors.NotAuthorized) as info:
            await c.set_override("gpu0/power_limit", 400, 0)
    assert str(info.value) == ("not authorized to override a knob: polkit denied SetOverride for this "
                               "caller (run it with sudo, or ask an administrator to allow "
                               "io.github.aithermd.override in polkit)")
    assert info.value.exit_code == wire.EXIT_NOT_AUTHORIZED


async def test_invalid_policy_on_reload_is_a_failure_with_file_and_line(fake_daemon, private_bus):
    fake_daemon.reload_error = "/etc/aithermd/policies/x.yaml:3: unknown key 'rulez'"
    async with DaemonClient(private_bus) as c:
        with pytest.raises(errors.DaemonError, match=r"x\.yaml:3: unknown key 'rulez' \(fix the file"):
            await c.reload()


async def test_daemon_not_running_and_bus_unreachable(private_bus, tmp_path):
    async with DaemonClient(private_bus) as c:
        with pytest.raises(errors.DaemonNotRunning) as info:
            await c.get_snapshot()
        assert await c.name_has_owner() is False
    assert str(info.value) == (f"aithermd is not running on the bus at {private_bus} "
                               f"(start it: aithermd run --bus {private_bus})")
    with pytest.raises(errors.BusUnreachable) as info:
        await DaemonClient(f"unix:path={tmp_path}/nobody").connect()
    assert info.value.exit_code == wire.EXIT_NOT_RUNNING


async def test_malformed_address_or_no_session_bus_is_unreachable_not_a_traceback(monkeypatch):
    with pytest.raises(errors.BusUnreachable) as info:
        await DaemonClient("garbage").connect()
    assert info.value.exit_code == wire.EXIT_NOT_RUNNING
    assert str(info.value).startswith("cannot reach the bus at garbage: ") and "\n" not in str(info.value)
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    with pytest.raises(errors.BusUnreachable) as info:
        await DaemonClient("session").connect()
    assert str(info.value).startswith("cannot reach the session bus: ")


def test_not_running_on_the_system_bus_says_how_to_start_it():
    assert str(errors.DaemonNotRunning("system")) == \
        "aithermd is not running on the system bus (start it: systemctl start aithermd)"


async def test_snapshots_follow_the_signal_and_end_when_the_daemon_leaves(fake_daemon, private_bus):
    async with DaemonClient(private_bus) as c:
        follower = c.snapshots(poll_s=60)
        assert (await anext(follower))["seq"] == 241
        await fake_daemon.publish()
        assert (await asyncio.wait_for(anext(follower), 5))["seq"] == 242
        fake_daemon.stop()
        with pytest.raises(errors.DaemonNotRunning):
            await asyncio.wait_for(anext(follower), 5)
        # a new daemon on the same bus: following again works on the same connection
        again = await FakeDaemon().start(private_bus)
        try:
            follower = c.snapshots(poll_s=60)
            assert (await asyncio.wait_for(anext(follower), 5))["seq"] == 241
        finally:
            again.stop()


async def test_snapshots_poll_when_no_signal_comes(fake_daemon, private_bus):
    async with DaemonClient(private_bus) as c:
        follower = c.snapshots(poll_s=0.05)
        await anext(follower)
        fake_daemon.doc["seq"] = 99
        assert (await asyncio.wait_for(anext(follower), 5))["seq"] == 99


async def test_events_arrive_decoded(fake_daemon, private_bus):
    async with DaemonClient(private_bus) as c:
        events = c.events()
        pending = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.05)
        await fake_daemon.emit("Event", "ss", ["fault", json.dumps({"subject": "gpu0", "message": "lost"})])
        assert await asyncio.wait_for(pending, 5) == ("fault", {"subject": "gpu0", "message": "lost"})


async def test_reconnects_after_the_connection_dropped(fake_daemon, private_bus):
    c = DaemonClient(private_bus)
    await c.connect()
    c._conn.disconnect()  # the connection breaks under us
    await asyncio.sleep(0.05)
    assert not c.connected
    assert (await c.get_snapshot())["seq"] == 241  # connect() again is implicit
    await c.close()


def test_activation_that_cannot_start_the_daemon_is_not_running_exit_3(tmp_path):
    """D-Bus activation of a unit that is masked or keeps failing: the bus answers with the activation's
    error (here dbus-daemon's own Spawn.ChildExited from an activation file whose Exec fails, on a systemd
    host org.freedesktop.systemd1.UnitMasked and friends). aithermctl says aithermd is not running: exit 3."""
    import subprocess
    import sys

    from tests.support.dbus import PrivateBus

    services = tmp_path / "services"
    services.mkdir()
    (services / f"{wire.BUS_NAME}.service").write_text(
        f"[D-BUS Service]\nName={wire.BUS_NAME}\nExec=/bin/false\n")
    with PrivateBus.start("session", service_dirs=[services]) as bus:
        address = bus.address
        out = subprocess.run([sys.executable, "-m", "aithermctl", "--bus", address, "status"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == wire.EXIT_NOT_RUNNING, out.stderr
    assert out.stderr.startswith(f"aithermctl: aithermd is not running on the bus at {address}: ")
    assert "journalctl -u aithermd" in out.stderr and len(out.stderr.splitlines()) == 1


async def test_a_document_of_another_shape_is_a_readable_error(fake_daemon, private_bus, monkeypatch):
    """An aithermd whose GetSnapshot lacks what aithermctl reads (an older or newer, incompatible one)."""
    doc = json.loads(json.dumps(fake_daemon.doc))
    del doc["devices"][0]["channels"]
    monkeypatch.setattr(fake_daemon, "m_GetSnapshot", lambda msg: json.dumps(doc))
    async with DaemonClient(private_bus) as c:
        with pytest.raises(errors.DaemonError) as info:
            await c.get_snapshot()
    assert str(info.value) == ("aithermd answered GetSnapshot with a document aithermctl cannot read "
                               "(devices[0]: missing channels); update aithermd and aithermctl together")
    assert info.value.exit_code == wire.EXIT_FAILURE
