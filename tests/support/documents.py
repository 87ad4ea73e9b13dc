"""The daemon's own documents and signals, for the tests of what reads them (aithermctl).

A consumer's test reads what the producer really emits: these documents come out of the real daemon —
its backends, policy engine, operator state, hub — and the real builders
(:class:`aithermd.publish.document.DocumentCache` and :func:`~aithermd.publish.document.with_processes`,
as ``GetSnapshot`` answers; :class:`aithermd.publish.history.History` over the hub's columns;
:meth:`aithermd.runtime.control.Control.explain`, ``list_policies`` and ``get_policy``;
:func:`aithermd.publish.document.event_signals`, the bodies of D-Bus ``Event``; the energy meter and
windows of :class:`aithermd.accounting.service.EnergyService`, as ``StopEnergyWindow`` answers):

- :func:`workstation` runs the daemon on the simulated workstation (RTX 4090 + RTX 6000 Ada behind the fake
  NVML, the X570 board with its nct6798 fans, k10temp and RAPL) under ``ai-training`` into the training
  phase, with ``quiet`` held on top (a detached hold found in the operator state, as after a restart); its
  Explain answer, its policies, the Event signals it sent and an energy window over the training come with
  it;
- :func:`board_without_gpus` runs it on the recorded X570 board (no GPU, no RAPL) under ``balanced``, with
  the nct6798's ``fan2`` failing (EIO) from the second tick, and energy accounting off (so its document
  has no ``processes``, as such a daemon's has none); its Event signals come with it.

Both are deterministic (simulated clock, fixed seed and start time), but for the energy accounting's pass
(``processes`` in the workstation's snapshot), which runs in a thread and so lands at a tick that depends on
the machine's load. ``python -m tests.support.documents`` writes them to the TUI's fixture files
(:data:`FIXTURE_FILES` in ``tests/tui/fixtures/``); ``tests/tui/test_fixtures_are_the_daemons.py`` checks
that the files are still what the daemon sends, and that everything aithermctl reads is in it. The one
rewrite: a policy's path names the shipped directory where a package installs it
(``/usr/share/aithermd/policies``), not this checkout.
"""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

from aithermd.accounting.meter import EnergyMeter
from aithermd.accounting.windows import EnergyWindows
from aithermd.model import Snapshot
from aithermd.policy.loader import shipped_policy_dir
from aithermd.publish.document import DocumentCache, event_signals, with_processes
from aithermd.publish.history import History
from aithermd.settings import DaemonSettings
from tests.support.clock import SimClock
from tests.support.machines import X570, copy_machine

NOON = 1_767_268_800.0  # 2026-01-01 12:00 UTC: daytime (quiet's night rule stays out of the way)
SEED = 3
TRAINING_S = 240.0  # the default cycle idles 2 minutes, then trains for 6: two minutes into training
HISTORY_S = 300.0  # GetHistory(300), the TUI's first ask
HOLD = {"cookie": 17, "policy": "quiet", "reason": "meeting in the lab", "owner": "detached", "uid": 0,
        "created": NOON + 60.0, "expires": None, "detached": True}
FAILING_FAN = "platform/nct6775.656/hwmon/hwmon1/fan2_input"  # the nct6798, as the backend opens it
WINDOW = ("python train.py", NOON + 180.0, 1000, 7)  # energy window: name, opened at, by uid, its id
INSTALLED_POLICIES = "/usr/share/aithermd/policies"


class Wall:
    """The clock of the energy windows: the wall time of the last snapshot."""

    t = 0.0

    def wall(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def boottime(self) -> float:  # the windows' run clock: the simulated time, which no NTP steps
        return self.t


class Listener:
    """A hub listener: the bodies of the D-Bus ``Event`` signals the daemon sends, as ``Daemon1`` makes them
    (:func:`event_signals`), and an energy window fed as the daemon's ``EnergyService`` feeds its windows
    (its meter's increment per snapshot), opened as :data:`WINDOW` says."""

    def __init__(self, window: tuple[str, float, int, int] | None = None) -> None:
        self.signals: list[tuple[str, dict[str, Any]]] = []
        self._previous: Snapshot | None = None
        self._window = window
        self.clock = Wall()
        self.meter = EnergyMeter()
        self.windows = EnergyWindows(self.clock, new_id=lambda: window[3] if window else 1)
        self.opened = False

    def __call__(self, snapshot: Snapshot, events: Any) -> None:
        self.signals.extend(event_signals(self._previous, snapshot, events))
        self._previous = snapshot
        self.clock.t = snapshot.t_wall
        if self._window is not None and not self.opened and snapshot.t_wall >= self._window[1]:
            self.windows.start(self._window[0], 0.0, self._window[2])
            self.opened = True
        self.windows.add(self.meter.feed(snapshot))

    def stop_window(self) -> dict[str, Any]:
        """``StopEnergyWindow``'s document of the window."""
        assert self._window is not None and self.opened
        return self.windows.stop(self._window[3], self._window[2])


def workstation(tmp_path: Path) -> dict[str, Any]:
    """The simulated workstation's documents (see the module docstring), as the daemon that ran answers
    them at its last tick: ``snapshot`` (GetSnapshot), ``history`` (GetHistory(300)), ``explain``
    (Explain("")), ``policies`` (ListPolicies), ``policy_quiet`` (GetPolicy("quiet")), ``signals`` (every
    Event signal sent: ``[kind, body]``) and ``window`` (StopEnergyWindow of :data:`WINDOW`)."""
    from aithermd.sim.runner import SimOptions, simulate

    state = tmp_path / "state"
    state.mkdir(parents=True)
    (state / "operator.json").write_text(json.dumps({"active_policy": "ai-training", "overrides": {},
                                                     "holds": [HOLD]}))
    listener = Listener(WINDOW)
    settings = DaemonSettings(policy="ai-training", bus="none", metrics_listen="none", log_level="error")
    opts = SimOptions(duration_s=TRAINING_S, speedup=0, seed=SEED, wall_start=NOON, state_dir=state,
                      listeners=[listener])
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0, f"the simulated daemon exited {result.code}"
    daemon = result.daemon
    energy = daemon.energy.processes_text() if daemon.energy is not None else None
    control = daemon.control
    return {"snapshot": json.loads(with_processes(DocumentCache().text(daemon.hub.latest), energy)),
            "history": json.loads(asyncio.run(History(daemon.hub).text(HISTORY_S))),
            "explain": _json(control.explain("")),
            "policies": _installed(control.list_policies()),
            "policy_quiet": _installed(control.get_policy("quiet")),
            "signals": _json(listener.signals),
            "window": _json(listener.stop_window())}


def board_without_gpus(tmp_path: Path, ticks: int = 5) -> dict[str, Any]:
    """The recorded X570 board's GetSnapshot document after ``ticks`` ticks (``snapshot``), the Event
    signals it sent (``signals``; see the module docstring) and its Explain("") answer (``explain``: its
    board fans still ramp down from the duty recorded with the board)."""
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
    listener = Listener()
    daemon.hub.add_listener(listener)
    code = asyncio.run(daemon.run(max_ticks=ticks))
    assert code == 0, f"the daemon exited {code}"
    assert daemon.hub.latest is not None
    return {"snapshot": json.loads(DocumentCache().text(daemon.hub.latest)),
            "signals": _json(listener.signals), "explain": _json(daemon.control.explain(""))}


def first_of_each(signals: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The first signal of each kind about each kind of subject (``power_limit``, ``pwm``, ``fan``...: the
    subject's last part without its number), in the order sent."""
    seen: set[tuple[str, str]] = set()
    out = []
    for kind, body in signals:
        key = (kind, str(body.get("subject") or "").rsplit("/", 1)[-1].rstrip("0123456789"))
        if key not in seen:
            seen.add(key)
            out.append((kind, body))
    return out


def _installed(doc: Any) -> Any:
    """``doc`` as JSON, the shipped policies' directory named where a package installs it."""
    return json.loads(json.dumps(doc).replace(json.dumps(str(shipped_policy_dir()))[1:-1],
                                              INSTALLED_POLICIES))


def _json(doc: Any) -> Any:
    """``doc`` as a client parses it (what travels is JSON text)."""
    return json.loads(json.dumps(doc))


# -- the TUI's fixture files ------------------------------------------------------------------------------
TUI_FIXTURES = Path(__file__).resolve().parents[1] / "tui" / "fixtures"
FIXTURE_FILES = ("snapshot.json", "history.json", "explain.json", "snapshot_nogpu.json", "events.json",
                 "policies.json", "policy_quiet.json", "energy.json")
# what depends on the machine's load, not on the simulation: compared by shape only
VOLATILE = {"snapshot.json": ("processes",)}


def fixture_documents(tmp_path: Path) -> dict[str, Any]:
    """File name → document, for every file of :data:`FIXTURE_FILES`. ``events.json``: the first Event
    signal of each kind about each kind of subject (:func:`first_of_each`), the workstation's then the
    board's (its failed fan)."""
    ws = workstation(tmp_path / "workstation")
    board = board_without_gpus(tmp_path / "board")
    return {"snapshot.json": ws["snapshot"], "history.json": ws["history"], "explain.json": ws["explain"],
            "snapshot_nogpu.json": board["snapshot"],
            "events.json": _json(first_of_each(ws["signals"]) + first_of_each(board["signals"])),
            "policies.json": ws["policies"], "policy_quiet.json": ws["policy_quiet"],
            "energy.json": ws["window"]}


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
