"""``aithermctl status`` shows the node power budget in force (the workstation policy's wall budget): what
it is, how it was worked out, what the devices draw and were allotted, and the wall draw that implies. It
was only in the metrics and in ``explain``. The document is the simulated daemon's own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from aithermctl.render import budget_lines, status_text
from aithermd.publish import wire
from aithermd.publish.document import DocumentCache
from aithermd.settings import DaemonSettings

NOON = 1_780_000_000.0 - 1_780_000_000.0 % 86400 + 12 * 3600  # a weekday noon (UTC): day budget, not quiet


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    from aithermd.sim.runner import SimOptions, simulate

    state: Path = tmp_path_factory.mktemp("ws") / "state"
    settings = DaemonSettings(policy="workstation", bus="none", metrics_listen="none", log_level="error",
                              energy_interval_s=0)
    opts = SimOptions(duration_s=200, speedup=0, seed=3, wall_start=NOON, state_dir=state)
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0
    return json.loads(DocumentCache().text(result.daemon.hub.latest))


def test_the_snapshot_document_carries_the_budget_split(doc):
    wire.snapshot_doc(doc, strict=True)
    budget = doc["budget"]
    assert budget["policy"] == "workstation" and budget["wall_w"] == 1440.0
    assert set(budget["devices"]) == {"gpu0", "gpu1", "powercap:package-0"}
    assert budget["allotted_w"] == pytest.approx(sum(d["allotted_w"] for d in budget["devices"].values()),
                                                 abs=0.2)
    assert budget["allotted_w"] <= budget["budget_w"]


def test_status_shows_the_budget_under_the_policy(doc):
    budget = doc["budget"]
    text = status_text(doc, now=doc["t_wall"])
    lines = text.splitlines()
    at = lines.index(f"power budget (workstation): {budget['budget_w']:.0f} W for the GPUs and CPU packages "
                     f"({budget['how']})")
    assert lines[at + 1] == (f"  drawn {budget['drawn_w']:.1f} W, allotted {budget['allotted_w']:.1f} W; "
                             f"at the wall ≈ {budget['wall_drawn_w']:.0f} W of 1440 W")
    assert at < lines.index("GPUs")


def test_a_budget_that_cannot_hold_is_flagged_and_no_budget_shows_nothing(doc):
    short = {**doc["budget"], "short_w": 42.0}
    assert budget_lines(short)[-1] == ("  ! 42 W below the lowest limits of its devices: each is held at its "
                                       "minimum, and it cannot hold")
    without = {k: v for k, v in doc.items() if k != "budget"}
    assert "power budget" not in status_text(without, now=doc["t_wall"])
