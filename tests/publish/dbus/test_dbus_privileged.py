"""Only root or polkit-authorized callers change anything; a refused call changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import pytest
from dbus_fast import Message, MessageFlag, MessageType
from dbus_fast.errors import DBusError
from dbus_helpers import HERE, NOBODY, call, ok, polkit_allow, polkit_checks, run_client_async

from aithermd import errors
from aithermd.publish import wire
from aithermd.publish.polkit import ERROR_INTERACTIVE_REQUIRED, Authorizer

MUTATIONS = [
    ["SetActivePolicy", "s", ["quiet"]],
    ["HoldPolicy", "ssdb", ["quiet", "meeting", 0.0, False]],
    ["ReleasePolicy", "u", [1]],
    ["SetOverride", "sdd", ["gpu0/power_limit", 300.0, 0.0]],
    ["ClearOverride", "s", ["gpu0/power_limit"]],
    ["Reload", "", []],
    ["ReleaseGpu", "s", ["gpu0"]],
    ["ReportProgress", "asd", [["gpu0"], 3.2]],
]


async def test_an_unprivileged_caller_is_refused_and_nothing_changes(service, client, control, bus_address):
    """A real uid-65534 process, polkit denying everything."""
    lines = await run_client_async(bus_address, MUTATIONS)
    assert lines[0]["uid"] == NOBODY
    assert [(line["member"], line["error"]) for line in lines[1:]] == [
        (m[0], wire.ERROR_NOT_AUTHORIZED) for m in MUTATIONS]
    assert control.calls == [] and control.active == "balanced" and control.holds == {}
    assert control.overrides == {} and control.reloads == 0


async def test_an_unprivileged_caller_may_read(service, client, bus_address):
    lines = await run_client_async(bus_address, [["GetSnapshot", "", []], ["ListPolicies", "", []]])
    assert [line["error"] for line in lines[1:]] == [None, None]
    assert json.loads(lines[1]["body"][0])["seq"] == 1


async def test_polkit_allows_an_unprivileged_caller_one_action_at_a_time(service, client, control,
                                                                          bus_address):
    await polkit_allow(client, [wire.ACTION_SET_POLICY])
    lines = await run_client_async(bus_address, [MUTATIONS[0], MUTATIONS[3]])
    assert [line["error"] for line in lines[1:]] == [None, wire.ERROR_NOT_AUTHORIZED]
    assert control.active == "quiet" and control.overrides == {}
    await polkit_allow(client, [wire.ACTION_OVERRIDE, wire.ACTION_HOLD_POLICY, wire.ACTION_RELOAD])
    detached_hold = ["HoldPolicy", "ssdb", ["quiet", "batch job", 3600.0, True]]
    lines = await run_client_async(bus_address, [MUTATIONS[3], detached_hold, MUTATIONS[5]])
    assert [line["error"] for line in lines[1:]] == [None, None, None]
    assert control.overrides == {"gpu0/power_limit": (300.0, 0.0)} and control.reloads == 1
    (hold,) = control.holds.values()  # detached: it outlives the process that asked
    assert hold["uid"] == NOBODY and hold["owner"] == lines[0]["unique_name"] and hold["timeout_s"] == 3600.0


async def test_a_user_allowed_to_hold_ends_only_their_own_holds(service, client, control, bus_address):
    """hold-policy is allow_active=yes in the shipped policy and the Holds property lists every cookie, so
    a cookie proves nothing: ending another uid's hold takes the administrator's set-policy action."""
    (root_hold,) = await ok(client, "HoldPolicy", "ssdb", ["quiet", "admin: overnight", 0.0, True])
    await polkit_allow(client, [wire.ACTION_HOLD_POLICY])
    own = ["HoldPolicy", "ssdb", ["balanced", "mine", 0.0, True]]
    lines = await run_client_async(bus_address, [["ReleasePolicy", "u", [root_hold]], own])
    assert lines[1]["error"] == wire.ERROR_NOT_AUTHORIZED
    assert f"hold {root_hold} belongs to uid 0; ending another user's hold needs " \
           f"{wire.ACTION_SET_POLICY}" in lines[1]["body"][0]
    assert lines[2]["error"] is None
    (mine,) = lines[2]["body"]
    assert set(control.holds) == {root_hold, mine}  # the refused release changed nothing
    lines = await run_client_async(bus_address, [["ReleasePolicy", "u", [mine]]])
    assert lines[1]["error"] is None and set(control.holds) == {root_hold}
    assert control.released_by == NOBODY
    await polkit_allow(client, [wire.ACTION_HOLD_POLICY, wire.ACTION_SET_POLICY])  # an administrator
    lines = await run_client_async(bus_address, [["ReleasePolicy", "u", [root_hold]]])
    assert lines[1]["error"] is None and control.holds == {}


async def test_a_progress_report_reaches_the_control(service, client, control):
    reply = await call(client, "ReportProgress", "asd", [["gpu0"], 3.25])
    assert reply.message_type is not MessageType.ERROR, reply.body
    assert control.calls == [("report_progress", ["gpu0"], 3.25)]


async def test_only_the_user_whose_job_alone_runs_on_a_gpu_may_report_its_progress(strict_service, client,
                                                                                     control):
    """hold-policy is every seat user's, and the efficient search follows a reported rate: a flat fake
    rate stepped another user's training job down to 263 W where its own signal sent it to 366 W; a
    desktop's graphics process on the GPU was enough to pass. Here no uid is root, so this test's uid 0
    is an ordinary user: its job alone computes on gpu0; gpu1 runs uid 1000's; gpu2 both."""
    await polkit_allow(client, [wire.ACTION_HOLD_POLICY])
    computing = {"gpu0": frozenset({0}), "gpu1": frozenset({1000}), "gpu2": frozenset({0, 1000}),
                 "gpu3": frozenset()}
    strict_service.interface._priv.gpu_uids = computing.get
    reply = await call(client, "ReportProgress", "asd", [["gpu0"], 3.25])
    assert reply.message_type is not MessageType.ERROR, reply.body
    for gpus, named in ((["gpu1"], "gpu1"), (["gpu0", "gpu2"], "gpu2"), (["gpu3"], "gpu3")):
        reply = await call(client, "ReportProgress", "asd", [gpus, 3.25])
        assert reply.message_type is MessageType.ERROR and reply.error_name == wire.ERROR_NOT_AUTHORIZED
        assert reply.body[0].startswith(f"uid 0 is not the one user computing on {named} (NVML's compute")
    strict_service.interface._priv.gpu_uids = lambda _gpu: None  # not known (no accounting): refused too
    reply = await call(client, "ReportProgress", "asd", [["gpu0"], 3.25])
    assert reply.error_name == wire.ERROR_NOT_AUTHORIZED
    assert control.calls == [("report_progress", ["gpu0"], 3.25)]


async def test_root_needs_no_polkit(service, client, control):
    await ok(client, "SetActivePolicy", "s", ["ai-training"])
    assert control.active == "ai-training"


async def test_with_root_not_special_polkit_decides_for_root_too(strict_service, client, control):
    reply = await call(client, "SetActivePolicy", "s", ["quiet"])
    assert reply.error_name == wire.ERROR_NOT_AUTHORIZED and control.active == "balanced"
    await polkit_allow(client, [wire.ACTION_SET_POLICY])
    await ok(client, "SetActivePolicy", "s", ["quiet"])
    assert control.active == "quiet"


async def test_polkit_may_ask_for_a_password_only_when_the_caller_allowed_it(strict_service, client, control):
    """G6: polkit is asked with AllowUserInteraction only for a call whose message carries
    ALLOW_INTERACTIVE_AUTHORIZATION. Without it, an action that needs a password is refused at once with
    InteractiveAuthorizationRequired and changes nothing; with it, the password typed, the call acts. An
    action polkit does not allow at all stays NotAuthorized, whatever the flag."""
    await polkit_allow(client, [], auth_required=[wire.ACTION_SET_POLICY])
    await polkit_checks(client)
    reply = await call(client, "SetActivePolicy", "s", ["quiet"])
    assert reply.error_name == ERROR_INTERACTIVE_REQUIRED
    assert reply.body[0].startswith(f"{wire.ACTION_SET_POLICY}: authentication required for uid 0, and the "
                                    "call did not allow a password prompt")
    assert control.active == "balanced" and control.calls == []
    assert await polkit_checks(client) == [(wire.ACTION_SET_POLICY, 0)]

    def interactive(member: str, signature: str, body: list) -> Message:
        return Message(destination=wire.BUS_NAME, path=wire.OBJECT_PATH, interface=wire.INTERFACE,
                       member=member, signature=signature, body=body,
                       flags=MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION)

    reply = await client.call(interactive("SetActivePolicy", "s", ["quiet"]))
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body
    assert control.active == "quiet"
    assert await polkit_checks(client) == [(wire.ACTION_SET_POLICY, 1)]
    reply = await client.call(interactive("Reload", "", []))
    assert reply.error_name == wire.ERROR_NOT_AUTHORIZED and control.reloads == 0
    assert await polkit_checks(client) == [(wire.ACTION_RELOAD, 1)]


async def test_aithermctl_lets_polkit_ask_unless_told_not_to(strict_service, client, control, bus_address):
    """aithermctl's client sets ALLOW_INTERACTIVE_AUTHORIZATION on the calls that change something, and
    not with --no-ask-password (ask_password=False), which a script gets refused at once."""
    from aithermctl import errors as ctl_errors
    from aithermctl.client import DaemonClient

    await polkit_allow(client, [], auth_required=[wire.ACTION_SET_POLICY])
    await polkit_checks(client)
    async with DaemonClient(bus_address, ask_password=False) as script:
        with pytest.raises(ctl_errors.NotAuthorized):
            await script.call("SetActivePolicy", "quiet")
    assert control.active == "balanced"
    async with DaemonClient(bus_address) as user:
        await user.call("SetActivePolicy", "quiet")
    assert control.active == "quiet"
    assert await polkit_checks(client) == [(wire.ACTION_SET_POLICY, 0), (wire.ACTION_SET_POLICY, 1)]


async def test_polkit_unreachable_means_only_root(strict_service, client):
    """CheckAuthorization failing (no polkit on the bus) refuses instead of allowing."""
    auth = Authorizer(strict_service.bus, root_uids=(), polkit_name="org.example.NoSuchPolkit")
    with pytest.raises(DBusError) as refused:
        await auth.authorize(client.unique_name, wire.ACTION_RELOAD)
    assert refused.value.type == wire.ERROR_NOT_AUTHORIZED
    assert await Authorizer(strict_service.bus).authorize(client.unique_name, wire.ACTION_RELOAD) == 0


async def test_arguments_are_validated_with_named_errors_and_nothing_changes(service, client, control):
    cases = [
        ("SetActivePolicy", "s", ["nope"], wire.ERROR_UNKNOWN_POLICY),
        ("SetActivePolicy", "s", [""], wire.ERROR_INVALID_ARGUMENT),
        ("HoldPolicy", "ssdb", ["nope", "r", 0.0, False], wire.ERROR_UNKNOWN_POLICY),
        ("HoldPolicy", "ssdb", ["quiet", "r", -5.0, False], wire.ERROR_INVALID_ARGUMENT),
        ("HoldPolicy", "ssdb", ["quiet", "r", float("nan"), False], wire.ERROR_INVALID_ARGUMENT),
        ("HoldPolicy", "ssdb", ["quiet", "x" * 2000, 0.0, False], wire.ERROR_INVALID_ARGUMENT),
        ("ReleasePolicy", "u", [42], wire.ERROR_UNKNOWN_COOKIE),
        ("SetOverride", "sdd", ["gpu9/power_limit", 300.0, 0.0], wire.ERROR_UNKNOWN_KNOB),
        ("SetOverride", "sdd", ["gpu0/power_limit", 900.0, 0.0], wire.ERROR_OUT_OF_RANGE),
        ("SetOverride", "sdd", ["gpu0/power_limit", 100.0, 0.0], wire.ERROR_OUT_OF_RANGE),
        ("SetOverride", "sdd", ["gpu0/power_limit", float("inf"), 0.0], wire.ERROR_INVALID_ARGUMENT),
        ("SetOverride", "sdd", ["gpu0/power_limit", 300.0, -1.0], wire.ERROR_INVALID_ARGUMENT),
        ("ClearOverride", "s", ["gpu9/fan0"], wire.ERROR_UNKNOWN_KNOB),
        ("SetOverride", "s", ["gpu0/power_limit"], "org.freedesktop.DBus.Error.UnknownMethod"),
        ("ReportProgress", "asd", [["gpu9"], 3.0], wire.ERROR_INVALID_ARGUMENT),
        ("ReportProgress", "asd", [["gpu0"], -1.0], wire.ERROR_INVALID_ARGUMENT),
        ("ReportProgress", "asd", [["gpu0"], float("nan")], wire.ERROR_INVALID_ARGUMENT),
        ("ReportProgress", "asd", [[""], 1.0], wire.ERROR_INVALID_ARGUMENT),
    ]
    for member, signature, body, expected in cases:
        reply = await call(client, member, signature, body)
        assert reply.message_type is MessageType.ERROR, (member, body)
        assert reply.error_name == expected, (member, body, reply.body)
    assert control.calls == [] and control.active == "balanced" and control.overrides == {}


async def test_a_limit_just_outside_the_constraints_is_clamped_and_the_applied_value_returned(service, client,
                                                                                            control):
    # gpu0's limit is 150–600 W: a tenth of the range (45 W) beyond a bound is clamped to it, not refused
    assert await ok(client, "SetOverride", "sdd", ["gpu0/power_limit", 630.0, 0.0]) == [600.0, []]
    assert await ok(client, "SetOverride", "sdd", ["gpu0/power_limit", 110.0, 60.0]) == [150.0, []]
    assert await ok(client, "SetOverride", "sdd", ["gpu0/power_limit", 300.0, 0.0]) == [300.0, []]
    assert control.overrides["gpu0/power_limit"] == (300.0, 0.0)
    assert [c[2] for c in control.calls] == [630.0, 110.0, 300.0]  # what was asked, before clamping


async def test_a_fan_set_to_stop_until_cleared_comes_back_with_a_warning(service, client, control):
    pwm = "hwmon:nct6798-isa-0290/pwm1"
    assert await ok(client, "SetOverride", "sdd", [pwm, 0.0, 0.0]) == [0.0, [
        f"{pwm} at 0 % with no end: its fan stays stopped until `aithermctl override clear {pwm}` (a critical "
        "temperature or a failed sensor still drives it to full)"]]
    assert await ok(client, "SetOverride", "sdd", [pwm, 0.0, 600.0]) == [0.0, []]  # it ends by itself
    assert await ok(client, "SetOverride", "sdd", [pwm, 35.0, 0.0]) == [35.0, []]  # it turns


async def test_root_releases_a_gpu_and_gets_what_was_done(service, client, control):
    assert await ok(client, "ReleaseGpu", "s", ["gpu1"]) == ["gpu1 released"]
    reply = await call(client, "ReleaseGpu", "s", ["hwmon:nct"])
    assert reply.error_name == wire.ERROR_UNKNOWN_KNOB
    assert control.calls == [("release_gpu", "gpu1")]


async def test_a_broken_reload_is_a_named_error(service, client, control):
    control.reload_error = errors.PolicyErrors([errors.PolicyError("quiet.yaml", "bad key", line=3, col=1)])
    reply = await call(client, "Reload")
    assert reply.error_name == wire.ERROR_POLICY_INVALID
    assert "quiet.yaml:3:1" in reply.body[0] and control.reloads == 0


async def test_reload_reads_the_policies_off_the_event_loop(service, client, control):
    """As SIGHUP does: the service keeps answering while the policy files are read and parsed."""
    import threading

    gate, seen = threading.Event(), {}
    real = control.reload

    def slow_reload() -> None:
        seen["on_loop"] = threading.current_thread() is threading.main_thread()
        seen["answered_meanwhile"] = gate.wait(30)  # opened by the test once GetSnapshot was answered
        real()

    control.reload = slow_reload
    reloading = asyncio.ensure_future(call(client, "Reload"))
    for _ in range(1000):
        if "on_loop" in seen:
            break
        await asyncio.sleep(0.01)
    assert (await call(client, "GetSnapshot")).message_type is MessageType.METHOD_RETURN
    gate.set()
    assert (await reloading).message_type is MessageType.METHOD_RETURN
    assert seen == {"on_loop": False, "answered_meanwhile": True} and control.reloads == 1


def _lingering_client(address: str, calls: list) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "client_call.py"), address, json.dumps(calls),
                             "--linger"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


async def _lines(proc: subprocess.Popen, n: int) -> list[dict]:
    return [json.loads(await asyncio.to_thread(proc.stdout.readline)) for _ in range(n)]


async def test_a_hold_ends_when_its_caller_leaves_the_bus_unless_detached(service, client, control,
                                                                          bus_address):
    proc = _lingering_client(bus_address, [["HoldPolicy", "ssdb", ["quiet", "job", 0.0, False]],
                                           ["HoldPolicy", "ssdb", ["ai-training", "slurm", 0.0, True]]])
    try:
        hello, attached, detached = await _lines(proc, 3)
        assert attached["error"] is None and detached["error"] is None
        assert set(control.holds) == {attached["body"][0], detached["body"][0]}
        proc.stdin.write("\n")
        proc.stdin.flush()
        await asyncio.to_thread(proc.wait, 30)
    finally:
        proc.kill()
    for _ in range(200):
        if ("release_owner", hello["unique_name"]) in control.calls:
            break
        await asyncio.sleep(0.02)
    assert ("release_owner", hello["unique_name"]) in control.calls
    assert list(control.holds) == [detached["body"][0]]
    assert control.holds[detached["body"][0]]["detached"] is True
    await ok(client, "ReleasePolicy", "u", [detached["body"][0]])
    assert control.holds == {}


async def test_in_flight_calls_per_connection_are_capped(bus_address, polkitd, control, hub, client):
    from aithermd.publish import dbus_service

    handle = await dbus_service.start(bus_address, control, hub, root_uids=(), max_in_flight=4)
    mock = dict(destination="org.freedesktop.PolicyKit1", path="/org/freedesktop/PolicyKit1/Authority",
                interface="org.freedesktop.DBus.Mock")
    try:
        await polkit_allow(client, [wire.ACTION_SET_POLICY])
        await call(client, "SimulateHang", "b", [True], **mock)
        pending = [asyncio.ensure_future(call(client, "SetActivePolicy", "s", ["quiet"])) for _ in range(6)]
        for _ in range(100):  # the two over the cap are answered at once, the four others hang in polkit
            if sum(p.done() for p in pending) == 2:
                break
            await asyncio.sleep(0.02)
        assert [p.result().error_name for p in pending if p.done()] == [wire.ERROR_BUSY] * 2
        assert control.calls == []
        (hanging,) = (await call(client, "HaveHangingCalls", **mock)).body
        assert hanging  # polkit holds the four in flight
        await call(client, "ReleaseHangingCalls", **mock)
        replies = await asyncio.gather(*pending)
        assert Counter(r.error_name or "ok" for r in replies) == {"ok": 4, wire.ERROR_BUSY: 2}
        assert control.calls == [("set_active_policy", "quiet")] * 4
        assert handle.tracker.in_flight(client.unique_name) == 0
        await ok(client, "GetSnapshot")  # the cap is released
    finally:
        await call(client, "SimulateHang", "b", [False], **mock)
        await handle.stop()
