"""Hostile policy text: alias bombs, NaN and infinity, control characters, tabs, endless windows.

Each is refused with FILE:LINE and what to do, quickly, and never reaches the engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aithermd.errors import PolicyErrors
from aithermd.policy.loader import MAX_VALUES, load_policies, load_policy_file, load_policy_text

ROOT = Path(__file__).resolve().parents[2]
BALANCED = (ROOT / "policies" / "balanced.yaml").read_text()

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{k}: &{k} [" + ",".join([f"*{j}"] * 9) + "]" for j, k in zip("abcdefgh", "bcdefghi", strict=True)]
) + "\n"
S0 = "p.yaml:{{line}}:{}: error: machines.load.states[0].enter.all[0]."


def at(old: str) -> int:
    """The line of balanced.yaml where ``old`` first appears (the errors below point at it)."""
    return BALANCED[:BALANCED.index(old)].count("\n") + 1


def errors(text: str) -> list[str]:
    with pytest.raises(PolicyErrors) as info:
        load_policy_text(text, name="p", path="p.yaml")
    return [e.format() for e in info.value.errors]


def test_alias_bomb_is_refused_without_expanding_it():
    # 9**9 list items once expanded; the loader stops after MAX_VALUES
    assert errors(BILLION_LAUGHS) == [
        f"p.yaml:1:1: error: the document expands to more than {MAX_VALUES} values (anchors and aliases "
        "repeating each other?): not a policy file"]


def test_anchors_and_aliases_of_ordinary_size_still_work():
    assert "&idle" in BALANCED and "*idle" in BALANCED
    assert load_policy_text(BALANCED, name="balanced").name == "balanced"


@pytest.mark.parametrize(("old", "new", "where"), [
    ("below: 10", "below: .nan", S0.format(77) + "below: should be a finite number"),
    ("60, below: 10", ".inf, below: 10", S0.format(66) + "window_s: should be a finite number"),
    ("[[40, 30]", "[[.nan, 30]", "p.yaml:{line}:15: error: curves.board.points[0][0]: should be a "
                                 "finite number"),
    ("hysteresis_c: 4", "hysteresis_c: .nan", "p.yaml:{line}:19: error: curves.board.hysteresis_c: should "
                                              "be a finite number"),
    ("smoothing_s: 20", "smoothing_s: .inf", "p.yaml:{line}:18: error: curves.board.smoothing_s: should be a "
                                             "finite number"),
    ("min_dwell_s: 30", "min_dwell_s: .inf", "p.yaml:{line}:22: error: machines.load.states[1].min_dwell_s: "
                                             "should be a finite number"),
    ("limit: 70%", "limit: .nan", "p.yaml:{line}:12: error: rules[1].limit: nan is not a power value: "
                                  "expected a finite number of watts"),
    ("limit: 70%", "limit: .inf", "p.yaml:{line}:12: error: rules[1].limit: inf is not a power value: "
                                  "expected a finite number of watts"),
])
def test_nan_and_infinity_are_refused_where_a_number_is_expected(old, new, where):
    assert old in BALANCED
    assert errors(BALANCED.replace(old, new, 1))[0] == where.replace("{line}", str(at(old)))


def test_a_window_longer_than_a_day_is_refused():
    # a window keeps every sample it covers: an endless one would grow the daemon's memory for ever
    text = BALANCED.replace("window_s: 60, below: 10", "window_s: 1e12, below: 10", 1)
    assert errors(text)[0] == (S0.format(66) + "window_s: should be less than or equal to "
                               "86400").replace("{line}", str(at("window_s: 60, below: 10")))


def test_a_control_character_is_reported_at_its_line_and_column():
    text = BALANCED.replace("rules:\n", "rules:\n# bell \x07 here\n", 1)
    line = text[:text.index("\x07")].count("\n") + 1
    assert errors(text) == [f"p.yaml:{line}:8: error: YAML: control character #x0007 is not allowed "
                            "(remove it; write it as an escape in a quoted string)"]


def test_a_tab_indent_gets_a_hint():
    assert errors("description: x\nrules:\n\t- name: a\n") == [
        "p.yaml:3:1: error: YAML: found character '\\t' that cannot start any token "
        "(hint: indent YAML with spaces, never tabs)"]


def test_endless_nesting_is_refused():
    assert errors("rules: " + "[" * 5000 + "]" * 5000 + "\n") == [
        "p.yaml: error: YAML: the document nests too deeply: not a policy file"]


def test_a_fifo_named_like_a_policy_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyErrors) as info:
        load_policy_file(fifo)  # before: open() blocked for ever
    assert [e.format() for e in info.value.errors] == [
        f"{fifo}: error: cannot read: not a regular file "
        "(hint: a policy is a YAML file; move this out of the way)"]


def test_a_directory_named_like_a_policy_fails_the_load_instead_of_the_policy_vanishing(tmp_path):
    d = tmp_path / "policies"
    d.mkdir()
    (d / "balanced.yaml").write_text(BALANCED)
    (d / "quiet.yaml").mkdir()  # e.g. an unpacking mistake
    with pytest.raises(PolicyErrors) as info:
        load_policies([d])
    assert [e.path for e in info.value.errors] == [str(d / "quiet.yaml")]
    assert "cannot read" in info.value.errors[0].message
