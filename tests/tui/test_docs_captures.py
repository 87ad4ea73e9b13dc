"""The TUI captures in docs/ (written by scripts/capture-tui from the real aithermctl against the real
daemon on the simulated workstation): each is a whole screen of its size, the README links every one, and
they show what the layout promises at both sizes (every fan at 80×24, no empty rows at 140×40)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CAPTURES = sorted((ROOT / "docs").glob("tui-screen-*.txt"))


def test_there_are_captures_at_80x24_and_140x40():
    names = {p.name for p in CAPTURES}
    wanted = {f"tui-screen-{s}-{z}.txt" for s in ("overview", "plots", "policy") for z in ("80x24", "140x40")}
    assert wanted <= names


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_each_capture_is_a_whole_screen_linked_from_the_readme(path):
    w, h = map(int, re.search(r"-(\d+)x(\d+)\.txt$", path.name).groups())
    lines = path.read_text().splitlines()
    assert len(lines) == h and max(len(line) for line in lines) <= w
    assert lines[0].startswith(" ● policy ai-training")  # connected to the daemon
    assert "q Quit" in lines[-1]
    assert f"(docs/{path.name})" in (ROOT / "README.md").read_text()


def test_the_overview_captures_show_every_fan_and_fill_the_screen():
    small = (ROOT / "docs" / "tui-screen-overview-80x24.txt").read_text()
    assert all(f"nct6798 fan{n} " in small for n in range(1, 7)) and "amdgpu fan1" in small
    large = (ROOT / "docs" / "tui-screen-overview-140x40.txt").read_text().splitlines()
    assert all(line.strip() for line in large)  # no empty row: the power plots fill what is left
    assert any("gpu0 power" in line and "gpu1 power" in line for line in large)
