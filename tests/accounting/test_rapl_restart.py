"""A RAPL package counter that wraps at ``max_energy_range_uj`` while the daemon is stopped (attack13 A2).

The recorded powercap tree (package-0: range 262,143 J, highest constraint 95 W: the counter represents
at most 2,759 s), the real RAPL backend and the real energy service with its state directory
(``energy.json``: the meter's saved points), on the fake clock. An energy window open across the restart
says what was booked: its package joules and its unmeasured seconds. Units J, W, s (µJ only in sysfs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from aithermd.accounting.service import STATE_FILE, EnergyService
from aithermd.backends.powercap import RaplBackend
from aithermd.model import Snapshot
from tests.support.clock import SimClock
from tests.support.machines import copy_machine

BOOT = "5b0e6c1d-9a2f-4e47-8c31-2f6d0b7a9e13"
PKG = "powercap:package-0"


class Rapl:
    """The package's ``energy_uj`` driven at a power (W), wrapping as the MSR does; the daemon's RAPL
    backend and energy service started and stopped over one state directory."""

    def __init__(self, tmp_path: Path, start_uj: int) -> None:
        self.root = copy_machine(tmp_path, "node-exporter-sys-class-powercap-intel-rapl.ttar")
        self.pkg = self.root / "class" / "powercap" / "intel-rapl:0"
        self.range_uj = int((self.pkg / "max_energy_range_uj").read_text())
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.clock = SimClock()
        self.raw = start_uj
        self._write()
        self.backend: RaplBackend | None = None
        self.service: EnergyService | None = None
        self.seq = 0

    def _write(self) -> None:
        (self.pkg / "energy_uj").write_text(f"{self.raw}\n")

    def draw(self, watts: float, seconds: float) -> None:
        """The package draws ``watts`` for ``seconds`` (the counter advances, mod its range + 1)."""
        self.raw = (self.raw + round(watts * seconds * 1e6)) % (self.range_uj + 1)
        self._write()

    def start(self) -> EnergyService:
        self.backend = RaplBackend(str(self.root), clock=self.clock)
        self.devices = tuple(self.backend.discover())
        self.service = EnergyService(self.clock, self.state, boot_id=BOOT)
        self.publish()
        return self.service

    def publish(self) -> None:
        assert self.backend is not None and self.service is not None
        self.seq += 1
        self.service.on_publish(Snapshot(self.seq, self.clock.monotonic(), self.clock.wall(), self.devices,
                                         self.backend.sample().readings))

    def run(self, watts: float, seconds: int) -> None:
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.draw(watts, 1.0)
            self.publish()

    def stop(self) -> None:
        assert self.backend is not None and self.service is not None
        self.service.stop()
        self.backend.close()
        self.backend = self.service = None

    def down(self, watts: float, seconds: float) -> None:
        self.clock.advance(seconds)
        self.draw(watts, seconds)


def _window_across_restart(rapl: Rapl, down_w: float, down_s: float,
                           edit_state=None) -> tuple[dict, list[dict]]:
    """Run 10 s at 50 W in a window, stop, ``down_s`` s down at ``down_w``, start again, 10 s at 50 W: the
    window's result and the log lines of the restart."""
    service = rapl.start()
    wid = service.windows.start("job", 0.0, uid=0)
    rapl.run(50.0, 10)
    rapl.stop()
    if edit_state is not None:
        path = rapl.state / STATE_FILE
        doc = json.loads(path.read_text())
        edit_state(doc)
        path.write_text(json.dumps(doc))
    rapl.down(down_w, down_s)
    with capture_logs() as logs:
        service = rapl.start()
    rapl.run(50.0, 10)
    result = service.windows.stop(wid, uid=0)
    rapl.stop()
    return result, [e for e in logs if e["event"].startswith("energy_downtime")]


def test_a_downtime_that_wraps_the_counter_once_counts_in_full(tmp_path):
    """150 kJ below the wrap, 2,500 s down at 90 W (225 kJ, within the 2,759 s the counter represents):
    the counter wraps once and ends below its saved value. All 225 kJ count (the old meter took the counter
    for one that went back and left the whole downtime unmeasured)."""
    rapl = Rapl(tmp_path, start_uj=262_143_328_850 - 150_000_000_000)
    result, logs = _window_across_restart(rapl, 90.0, 2500.0)
    assert result["joules"][PKG] == pytest.approx(500.0 + 225_000.0 + 500.0, abs=1e-3)
    assert result["unmeasured_s"] == 0.0
    assert not [e for e in logs if e["event"] == "energy_downtime_unmeasured" and e["device"] == PKG]


def test_after_a_run_that_saw_a_wrap_a_downtime_without_one_counts(tmp_path):
    """The first run itself sees the counter wrap (its total is then a range above the counter); 1,000 s
    down at 90 W, no wrap: 90 kJ count (the old meter compared the counter with that total: "went back",
    the downtime silently unmeasured)."""
    rapl = Rapl(tmp_path, start_uj=262_143_328_850 - 200_000_000)  # 200 J below the wrap: wraps at 4 s
    result, _ = _window_across_restart(rapl, 90.0, 1000.0)
    assert result["joules"][PKG] == pytest.approx(500.0 + 90_000.0 + 500.0, abs=1e-3)
    assert result["unmeasured_s"] == 0.0


def test_a_downtime_longer_than_the_counter_represents_is_unmeasured_never_the_remainder(tmp_path):
    """3,000 s down at 100 W: 300 kJ, 1.14 ranges; the counter ends 38 kJ above its saved value. The gap is
    over the 2,759 s the counter can represent: nothing of it is booked, its time is unmeasured, and a log
    line says why (the old meter booked the 38 kJ remainder as the downtime)."""
    rapl = Rapl(tmp_path, start_uj=10_000_000_000)
    result, logs = _window_across_restart(rapl, 100.0, 3000.0)
    assert result["joules"][PKG] == pytest.approx(1000.0, abs=1e-3)
    assert result["unmeasured_s"] == pytest.approx(3000.0)
    (line,) = [e for e in logs if e["event"] == "energy_downtime_unmeasured" and e["device"] == PKG]
    assert line["gap_s"] == pytest.approx(3000.0) and "longer than the counter can represent" in line["why"]


def test_a_downtime_over_a_range_at_the_power_drawn_at_the_stop_is_unmeasured(tmp_path):
    """The package draws 100 W, over its stated 95 W, before and through 2,700 s down: 270 kJ, 1.03 ranges,
    though 2,700 s is under the 2,759 s of the stated power. At the 100 W measured when the daemon stopped
    the counter wraps in 2,621 s: unmeasured, never the 7.9 kJ remainder."""
    rapl = Rapl(tmp_path, start_uj=10_000_000_000)
    service = rapl.start()
    wid = service.windows.start("job", 0.0, uid=0)
    rapl.run(100.0, 10)
    rapl.stop()
    rapl.down(100.0, 2700.0)
    with capture_logs() as logs:
        service = rapl.start()
    rapl.run(100.0, 10)
    result = service.windows.stop(wid, uid=0)
    rapl.stop()
    assert result["joules"][PKG] == pytest.approx(2000.0, abs=1e-3)
    assert result["unmeasured_s"] == pytest.approx(2700.0)
    (line,) = [e for e in logs if e["event"] == "energy_downtime_unmeasured" and e["device"] == PKG]
    assert "at the 100 W it drew when the daemon stopped" in line["why"]


def _as_before(doc: dict) -> None:
    """The saved points as a daemon before this change wrote them: no raw counter, no range."""
    for point in doc["points"].values():
        point.pop("counter_j", None), point.pop("modulus_j", None)


def test_the_saved_points_carry_the_raw_counter_and_its_range(tmp_path):
    rapl = Rapl(tmp_path, start_uj=262_143_328_850 - 200_000_000)
    rapl.start()
    rapl.run(50.0, 10)  # wraps at 4 s: the total is the counter + one range
    rapl.stop()
    point = json.loads((rapl.state / STATE_FILE).read_text())["points"][f"{PKG}/energy"]
    assert point["counter_j"] == pytest.approx(rapl.raw / 1e6, abs=1e-6)
    assert point["modulus_j"] == pytest.approx(262_143.328851, abs=1e-6)
    assert point["joules"] == pytest.approx(point["counter_j"] + 262_143.328850, abs=1e-3)


def test_an_old_point_under_one_range_stands_for_the_counter(tmp_path):
    """An energy.json of before (no raw counter) whose total is under one range: that run saw no wrap, its
    total is the counter; a downtime that wraps once counts in full."""
    rapl = Rapl(tmp_path, start_uj=262_143_328_850 - 150_000_000_000)
    result, _ = _window_across_restart(rapl, 90.0, 2500.0, edit_state=_as_before)
    assert result["joules"][PKG] == pytest.approx(500.0 + 225_000.0 + 500.0, abs=1e-3)
    assert result["unmeasured_s"] == 0.0


def test_an_old_point_over_one_range_is_unmeasured_and_says_so(tmp_path):
    """An energy.json of before whose total is over one range (that run saw a wrap: the counter's value
    then is unknown): the downtime is unmeasured, with a log line, never a guess."""
    rapl = Rapl(tmp_path, start_uj=262_143_328_850 - 200_000_000)
    result, logs = _window_across_restart(rapl, 90.0, 1000.0, edit_state=_as_before)
    assert result["joules"][PKG] == pytest.approx(1000.0, abs=1e-3)
    assert result["unmeasured_s"] == pytest.approx(1000.0)
    (line,) = [e for e in logs if e["event"] == "energy_downtime_unmeasured" and e["device"] == PKG]
    assert "without its raw counter" in line["why"]
