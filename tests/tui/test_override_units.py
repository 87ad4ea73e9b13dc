"""``aithermctl override KNOB 80%`` on a knob set in W used to set 80 W (SetOverride carries the number only).
Now ``N%`` of a power limit is N percent of its default, as in policies; any other unit that is not the
knob's is a usage error, and nothing is sent."""

from __future__ import annotations

import pytest
from cli_helpers import ctl

from aithermctl.durations import check_unit
from aithermd.publish import wire


@pytest.mark.parametrize(("text", "unit"), [("300", "W"), ("300W", "W"), ("300 w", "W"), ("60%", "%"),
                                            ("60", "%"), ("60%", None), ("70C", "°C"),
                                            ("1500MHz", "MHz"), ("1500", "MHz")])
def test_the_knobs_own_unit_or_none_passes(text, unit):
    check_unit(text, unit)


@pytest.mark.parametrize(("text", "unit", "given"), [("80%", "W", "%"), ("50W", "%", "W"),
                                                     ("70C", "W", "°C"), ("1500MHz", "W", "MHz"),
                                                     ("80%", "MHz", "%")])
def test_another_unit_is_refused(text, unit, given):
    with pytest.raises(ValueError) as info:
        check_unit(text, unit)
    assert str(info.value) == (f"{text!r} is in {given}, but this knob is set in {unit}: give a value in "
                               f"{unit}")


async def test_override_with_the_wrong_unit_sends_nothing(fake_daemon, private_bus):
    rc, _, err = await ctl(private_bus, "override", "gpu0/fan0", "50W")
    assert rc == wire.EXIT_USAGE and fake_daemon.overrides == {}
    assert err == "aithermctl: '50W' is in W, but this knob is set in %: give a value in %\n"
    rc, _, _ = await ctl(private_bus, "override", "gpu0/power_limit", "400W")
    assert rc == 0 and fake_daemon.overrides == {"gpu0/power_limit": (400.0, 0.0)}


async def test_a_negative_value_or_duration_gets_its_own_message_and_sends_nothing(fake_daemon, private_bus):
    """argparse took '-300W' and '-5m' for options ("unrecognized arguments", "expected one argument")."""
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "-300W")
    assert rc == wire.EXIT_USAGE and fake_daemon.overrides == {}
    assert err == ("aithermctl: a negative value: '-300W' (a knob's value is 0 or more: 250, 250W, 60%, "
                   "1500MHz)\n")
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "300W", "--for", "-5m")
    assert rc == wire.EXIT_USAGE and fake_daemon.overrides == {}
    assert "argument --for: not a duration: '-5m'" in err
    rc, _, err = await ctl(private_bus, "override", "gpu0/power_limit", "-300W", "--for", "5m")
    assert rc == wire.EXIT_USAGE and "a negative value: '-300W'" in err and fake_daemon.overrides == {}


def test_only_hold_and_override_arguments_are_rearranged():
    from aithermctl.cli import _negative_values

    assert _negative_values(["override", "gpu0/fan0", "-5", "--for", "1m"]) == [
        "override", "--for=1m", "--", "gpu0/fan0", "-5"]
    assert _negative_values(["hold", "quiet", "--reason", "x", "--timeout", "-1h"]) == [
        "hold", "--reason=x", "--timeout=-1h", "quiet"]
    user = ["run", "--policy", "quiet", "python", "train.py", "--lr", "-5"]
    assert _negative_values(user) == user
    assert _negative_values(["override", "--", "gpu0/fan0", "-5"]) == ["override", "--", "gpu0/fan0", "-5"]
    assert _negative_values(["run", "--policy", "p", "python", "override", "-5"]) == [
        "run", "--policy", "p", "python", "override", "-5"]
    assert _negative_values(["--bus", "session", "override", "k/x", "-5"]) == [
        "--bus", "session", "override", "--", "k/x", "-5"]
    assert _negative_values(["--no-ask-password", "--bus=session", "override", "k/x", "-5"]) == [
        "--no-ask-password", "--bus=session", "override", "--", "k/x", "-5"]


def test_explain_of_an_empty_knob_is_a_usage_error(capsys):
    from aithermctl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["explain", ""])
    assert info.value.code == wire.EXIT_USAGE
    assert "argument KNOB: is empty: give a knob id" in capsys.readouterr().err
