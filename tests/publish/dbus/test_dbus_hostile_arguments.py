"""Hostile arguments from an authorized caller: escape sequences in a hold reason (shown to every user by
``aithermctl status`` and the TUI) and absurd durations (a 1e308 s hold printed a 300-digit "h left") are
refused with InvalidArgument, and nothing changes."""

from __future__ import annotations

from dbus_fast import MessageType
from dbus_helpers import call, ok

from aithermd.publish import wire
from aithermd.publish.dbus_control import MAX_DURATION_S


async def test_control_characters_and_endless_durations_are_refused(service, client, control):
    cases = [
        (["HoldPolicy", "ssdb", ["quiet", "x\x1b]0;owned\x07\x1b[2J", 60.0, True]],
         "reason must not contain control characters"),
        (["HoldPolicy", "ssdb", ["quiet", "line\nbreak", 60.0, True]],
         "reason must not contain control characters"),
        (["SetActivePolicy", "s", ["quiet\x1b[31m"]], "policy must not contain control characters"),
        (["HoldPolicy", "ssdb", ["quiet", "r", 1e308, True]],
         "timeout_s 1e+308 s is more than a year (31536000 s); give less, or 0 for no end"),
        (["SetOverride", "sdd", ["gpu0/power_limit", 300.0, MAX_DURATION_S * 2]],
         "seconds 6.3072e+07 s is more than a year (31536000 s); give less, or 0 for no end"),
    ]
    for (member, signature, body), message in cases:
        reply = await call(client, member, signature, body)
        assert reply.message_type is MessageType.ERROR, (member, body)
        assert (reply.error_name, reply.body[0]) == (wire.ERROR_INVALID_ARGUMENT, message)
    assert control.calls == [] and control.holds == {} and control.overrides == {}


async def test_ordinary_text_and_long_durations_still_pass(service, client, control):
    await ok(client, "HoldPolicy", "ssdb", ["quiet", "réunion — 会議 (tab-free)", MAX_DURATION_S, True])
    await ok(client, "SetOverride", "sdd", ["gpu0/power_limit", 300.0, 0.0])
    assert [h["reason"] for h in control.holds.values()] == ["réunion — 会議 (tab-free)"]
    assert control.overrides == {"gpu0/power_limit": (300.0, 0.0)}
