"""The daemon's own GetSnapshot and GetHistory documents, for the tests of what reads them (aithermctl).

A consumer's test reads what the producer really emits: these documents come out of the real daemon —
its backends, policy engine, operator state, hub — and the real builders
(:class:`aithermd.publish.document.DocumentCache` and :func:`~aithermd.publish.document.with_processes`,
as ``GetSnapshot`` answers; :class:`aithermd.publish.history.History` over the hub's columns;
:meth:`aithermd.runtime.control.Control.explain`):

- :func:`workstation` runs the daemon on the simulated workstation (RTX 4090 + RTX 6000 Ada behind the fake
  NVML, the X570 board with its nct6798 fans, k10temp and RAPL) under ``ai-training`` into the training
  phase, with ``quiet`` held on top (a detached hold found in the operator state, as after a restart); its
  Explain answer comes with it;
- :func:`board_without_gpus` runs it on the recorded X570 board (no GPU, no RAPL) under ``balanced``, with
  the nct6798's ``fan2`` failing (EIO) from the second tick, and energy accounting off (so its document
  has no ``processes``, as such a daemon's has none).

Both are deterministic (simulated clock, fixed seed and start time). ``python -m tests.support.documents``
writes them to the TUI's fixture files (``tests/tui/fixtures/snapshot.json``, ``history.json``,
``explain.json``, ``snapshot_nogpu.json``); ``tests/tui/test_fixtures_are_the_daemons.py`` checks that the
files still have the shape of what the daemon sends, and that everything aithermctl reads is in it.
"""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

from aithermd.publish.document import DocumentCache, with_processes
from aithermd.publish.history import History
from aithermd.publish.wire import HistoryDoc, SnapshotDoc
from aithermd.settings import DaemonSettings
from tests.support.clock import SimClock
from tests.support.machines import X570, copy_machine

NOON = 1_767_268_800.0  # 2026-01-01 12:00 UTC: daytime (quiet's night rule stays out of the way)
SEED = 3
TRAINING_S = 240.0  # the default cycle idles 2 minutes, then trains for 6: two minutes into training
HISTORY_S = 300.0  # GetHistory(300), the TUI's first ask
HOLD = {"cookie": 17, "policy": "quiet", "reason": "meeting in the lab", "owner": "detached", "uid": 0,
        "created": NOON + 60.0, "expires": None, "detached": True}
FAILING_FAN = "class/hwmon/hwmon1/fan2_input"  # the nct6798 (hwmon1 on this board)


def workstation(tmp_path: Path) -> tuple[SnapshotDoc, HistoryDoc, dict[str, Any]]:
    """The simulated workstation's GetSnapshot, GetHistory(300) and Explain("") documents (see the module
    docstring), as the daemon that ran answers them at its last tick."""
    from aithermd.sim.runner import SimOptions, simulate

    state = tmp_path / "state"
    state.mkdir(parents=True)
    (state / "operator.json").write_text(json.dumps({"active_policy": "ai-training", "overrides": {},
                                                     "holds": [HOLD]}))
    settings = DaemonSettings(policy="ai-training", bus="none", metrics_listen="none", log_level="error")
    opts = SimOptions(duration_s=TRAINING_S, speedup=0, seed=SEED, wall_start=NOON, state_dir=state)
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0, f"the simulated daemon exited {result.code}"
    daemon = result.daemon
    energy = daemon.energy.processes_text() if daemon.energy is not None else None
    snapshot = json.loads(with_processes(DocumentCache().text(daemon.hub.latest), energy))
    history = json.loads(asyncio.run(History(daemon.hub).text(HISTORY_S)))
    return snapshot, history, _json(daemon.control.explain(""))


def board_without_gpus(tmp_path: Path, ticks: int = 5) -> SnapshotDoc:
    """The recorded X570 board's GetSnapshot document after ``ticks`` ticks (see the module docstring)."""
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.runtime.daemon import Daemon
    from tests.backends.faults import FaultIO

    root = copy_machine(tmp_path, X570)
    io = FaultIO()
    clock = SimClock()
    settings = DaemonSettings(sysfs_root=root, state_dir=tmp_path / "state", policy="balanced",
                              policy_pinned=True, bus="none", metrics_listen="none", nvml=False,
                              log_level="error", energy_interval_s=0)  # no accounting: no "processes"

    def fan_fails(t: float) -> None:
        if daemon.hub.latest is not None:
            io.faults[FAILING_FAN] = [OSError(errno.EIO, "Input/output error")]

    daemon = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root), io=io, clock=clock)],
                    sleep=clock.sleep, before_sample=fan_fails)
    code = asyncio.run(daemon.run(max_ticks=ticks))
    assert code == 0, f"the daemon exited {code}"
    assert daemon.hub.latest is not None
    return json.loads(DocumentCache().text(daemon.hub.latest))


def _json(doc: Any) -> Any:
    """``doc`` as a client parses it (what travels is JSON text)."""
    return json.loads(json.dumps(doc))


# -- the TUI's fixture files ------------------------------------------------------------------------------
TUI_FIXTURES = Path(__file__).resolve().parents[1] / "tui" / "fixtures"
FIXTURE_FILES = ("snapshot.json", "history.json", "explain.json", "snapshot_nogpu.json")


def fixture_documents(tmp_path: Path) -> dict[str, Any]:
    """File name → document, for every file of :data:`FIXTURE_FILES`."""
    snapshot, history, explained = workstation(tmp_path / "workstation")
    return {"snapshot.json": snapshot, "history.json": history, "explain.json": explained,
            "snapshot_nogpu.json": board_without_gpus(tmp_path / "board")}


def fixture_text(name: str, doc: Any) -> str:
    """How a fixture file is written: snapshots indented, history one series per line (both diff well)."""
    if name != "history.json":
        return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"

    def columns(member: str) -> str:
        return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc[member].items())

    return (f'{{"t": {json.dumps(doc["t"])},\n "series": {{\n{columns("series")}}},\n'
            f' "units": {json.dumps(doc["units"], ensure_ascii=False)},\n'
            f' "knobs": {{\n{columns("knobs")}}},\n'
            f' "knob_units": {json.dumps(doc["knob_units"], ensure_ascii=False)}}}\n')


def main() -> int:
    """``python -m tests.support.documents``: rewrite the TUI's fixture files from the daemon."""
    import tempfile

    from aithermd import log

    log.setup("error", "json")
    with tempfile.TemporaryDirectory(prefix="aithermd-fixtures-") as tmp:
        docs = fixture_documents(Path(tmp))
    for name, doc in docs.items():
        (TUI_FIXTURES / name).write_text(fixture_text(name, doc))
        print(f"wrote {TUI_FIXTURES / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
