"""Snapshot tests: the whole screen, as text, against the scripted fake client, compared with the stored
captures in fixtures/screens/ (80×24 for each screen, and the overview wide). A change in layout or wording
shows up as a diff here; after checking it by eye, refresh the captures with
``AITHERMCTL_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/tui/test_screen_snapshots.py``."""

import os
from pathlib import Path

import pytest
from fake_client import FakeClient
from screen_text import screen_text

from aithermctl.app import AithermApp

SCREENS = Path(__file__).parent / "fixtures" / "screens"


@pytest.mark.parametrize(("name", "key", "size"), [
    ("overview-80x24", "", (80, 24)),
    ("overview-140x40", "", (140, 40)),
    ("plots-80x24", "2", (80, 24)),
    ("plots-140x40", "2", (140, 40)),
    ("policy-80x24", "3", (80, 24)),
    ("help-80x24", "question_mark", (80, 24)),
])
async def test_screen_matches_its_capture(name, key, size):
    app = AithermApp(FakeClient(), retry_s=(0.01, 0.02), poll_s=60.0)
    async with app.run_test(size=size) as pilot:
        for _ in range(3):
            await pilot.pause()
        if key:
            await pilot.press(key)
            for _ in range(3):
                await pilot.pause()
        text = screen_text(app) + "\n"
    path = SCREENS / f"{name}.txt"
    if os.environ.get("AITHERMCTL_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    lines = text.splitlines()
    assert len(lines) == size[1] and max(len(line) for line in lines) <= size[0]
    assert text == path.read_text(), f"{name} differs from {path} (see the module docstring)"
