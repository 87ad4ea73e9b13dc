"""systemd/io.github.aithermd.policy: valid polkit XML, one action per privileged method family, sane
defaults."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from _ship import SYSTEMD, need_tool

from aithermd.publish import wire

POLICY = SYSTEMD / "io.github.aithermd.policy"
POLKIT_DTD = Path("/usr/share/polkit-1/policyconfig-1.dtd")


def defaults() -> dict[str, dict[str, str]]:
    root = ET.parse(POLICY).getroot()
    return {a.get("id"): {d.tag: (d.text or "").strip() for d in a.find("defaults")}
            for a in root.iter("action")}


def test_valid_against_polkit_dtd() -> None:
    xmllint = need_tool("xmllint")
    if not POLKIT_DTD.exists():
        pytest.skip("polkitd's DTD is not installed")
    done = subprocess.run([xmllint, "--noout", "--dtdvalid", str(POLKIT_DTD), str(POLICY)],
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")


def test_one_action_per_privileged_method_family() -> None:
    assert set(defaults()) == {wire.ACTION_SET_POLICY, wire.ACTION_HOLD_POLICY, wire.ACTION_OVERRIDE,
                               wire.ACTION_RELOAD}


def test_every_action_has_a_description_and_message() -> None:
    for action in ET.parse(POLICY).getroot().iter("action"):
        assert (action.findtext("description") or "").strip()
        assert "Authentication is required" in (action.findtext("message") or "")


def test_defaults() -> None:
    got = defaults()
    admin = {"allow_any": "auth_admin", "allow_inactive": "auth_admin_keep",
             "allow_active": "auth_admin_keep"}
    assert got[wire.ACTION_SET_POLICY] == admin
    assert got[wire.ACTION_OVERRIDE] == admin
    assert got[wire.ACTION_RELOAD] == admin
    # A hold is temporary and bounded by the admin's policies: the active local user may take one.
    assert got[wire.ACTION_HOLD_POLICY] == {**admin, "allow_active": "yes"}
    # Never a blanket yes for remote or inactive sessions.
    assert all(d["allow_any"] == "auth_admin" and d["allow_inactive"] != "yes" for d in got.values())
