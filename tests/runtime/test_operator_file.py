"""operator.json of valid JSON but the wrong shape, or values SetOverride refuses (attack6 G8): the daemon
starts with the good part, says what it dropped and why, and keeps the bad file aside."""

from __future__ import annotations

import json

import pytest
import structlog

from aithermd.runtime.control import STATE_FILE
from tests.runtime.test_control import make, policies  # noqa: F401 - the fixture

GOOD_HOLD = {"cookie": 7, "policy": "quiet", "reason": "job", "owner": "detached", "uid": 1000,
             "created": 1.0, "expires": None, "detached": True}


def start_with(tmp_path, clock, policies, doc):  # noqa: F811
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_text(json.dumps(doc))
    with structlog.testing.capture_logs() as logs:
        op = make(tmp_path, clock, policies)
    return op, [e for e in logs if e["event"] == "operator_state_invalid"]


@pytest.mark.parametrize("doc", [[1], "x", 5, None, {"overrides": [1]}, {"holds": 5}, {"holds": [1]},
                                 {"overrides": {"hwmon:nct/pwm1": 5}}, {"active_policy": 3},
                                 {"holds": [{**GOOD_HOLD, "cookie": "7"}]}, {"holds": [{"cookie": 1}]}])
def test_a_wrong_shape_is_dropped_said_and_kept_aside(tmp_path, clock, policies, doc):  # noqa: F811
    op, errors = start_with(tmp_path, clock, policies, doc)
    assert op.active == "balanced" and op.holds == [] and op.override_values() == {}
    assert len(errors) == 1 and errors[0]["dropped"], errors
    bad = tmp_path / "state" / (STATE_FILE + ".bad")
    assert json.loads(bad.read_text()) == doc  # nothing lost


@pytest.mark.parametrize("value", [-50, 1e9, "50", True, None])
def test_an_override_setoverride_refuses_is_not_brought_back(tmp_path, clock, policies, value):  # noqa: F811
    """``{"value": -50}`` was applied as "operator override to -50 %" (the fan at 0 %)."""
    doc = {"active_policy": "quiet", "holds": [GOOD_HOLD], "overrides": {
        "hwmon:nct/pwm1": {"value": value, "expires_wall": None},
        "gpu0/power_limit": {"value": 300, "expires_wall": None}}}
    op, errors = start_with(tmp_path, clock, policies, doc)
    assert op.override_values() == {"gpu0/power_limit": 300.0}  # the good part kept
    assert op.active == "quiet" and [h.cookie for h in op.holds] == [7]
    assert "override hwmon:nct/pwm1" in errors[0]["dropped"][0]
    # the good part is what the state file holds now; the bad one is aside
    again = make(tmp_path, clock, policies)
    assert again.override_values() == {"gpu0/power_limit": 300.0} and again.active == "quiet"
    assert (tmp_path / "state" / (STATE_FILE + ".bad")).exists()


def test_an_override_of_a_read_only_knob_is_dropped(tmp_path, clock, policies):  # noqa: F811
    doc = {"overrides": {"gpu0/fan0": {"value": 50, "expires_wall": None}}}
    op, errors = start_with(tmp_path, clock, policies, doc)
    assert op.override_values() == {} and "read-only" in errors[0]["dropped"][0]


def test_a_good_file_is_left_where_it_is(tmp_path, clock, policies):  # noqa: F811
    doc = {"active_policy": "quiet", "holds": [GOOD_HOLD],
           "overrides": {"hwmon:nct/pwm1": {"value": 40.0, "expires_wall": None}}}
    op, errors = start_with(tmp_path, clock, policies, doc)
    assert errors == [] and op.override_values() == {"hwmon:nct/pwm1": 40.0}
    assert not (tmp_path / "state" / (STATE_FILE + ".bad")).exists()
