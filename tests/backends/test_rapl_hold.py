"""The RAPL hold on a jump of ``energy_uj`` (attack9 N4), through the real RaplBackend on the recorded
node-exporter powercap tree (package-0: constraints up to 95 W, so a read over 190 W is suspect) and the
real EnergyMeter: a jump held one read deep was counted in full when it lasted two reads or stayed (a step),
and published as an ``ok`` 2 050 W power reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from aithermd.accounting.meter import EnergyMeter
from aithermd.backends.powercap import RaplBackend
from aithermd.model import Snapshot, Status
from tests.support.clock import SimClock
from tests.support.machines import copy_machine

PACKAGE = "powercap:package-0"
GLITCH_UJ = 4_000_000_000  # +4 kJ on a 50 W package

# name → ({second: µJ added to energy_uj's true value in the read at that second}, J lost)
GLITCHES = {
    "one read": ({30: GLITCH_UJ}, 0.0),
    "two reads": ({30: GLITCH_UJ, 31: GLITCH_UJ}, 0.0),
    # two reads after the jump agree on 50 W: a step, re-based; the read going back 4 kJ is then a
    # counter reset (energy_uj cannot go back 4 kJ in a second), its second not counted
    "three reads": ({30: GLITCH_UJ, 31: GLITCH_UJ, 32: GLITCH_UJ}, 50.0),
    "a step that stays": ({s: GLITCH_UJ for s in range(30, 60)}, 0.0),
    # never two reads in a row that agree: given up after HOLD_READS reads, counted at the last 50 W
    "noise, then a step": ({30: GLITCH_UJ, 31: 1_000_000_000, 32: 3_000_000_000, 33: 2_000_000_000,
                            **{s: 2_500_000_000 for s in range(34, 60)}}, 0.0),
}


def run(root: Path, offsets: dict[int, int], watts=lambda s: 50.0) -> tuple[float, float, list]:
    """60 reads 1 s apart of a package drawing ``watts(s)`` W; → (J the meter counted, J truly drawn,
    [(s, power reading)])."""
    energy = root / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
    clock = SimClock()
    backend = RaplBackend(str(root), clock=clock)
    devices = tuple(backend.discover())
    meter = EnergyMeter(clock=clock)
    raw, truth, counted, powers = 1_000_000, 0.0, 0.0, []
    for s in range(60):
        clock.advance(1.0)
        raw += int(watts(s) * 1e6)
        truth += watts(s) if s else 0.0
        energy.write_text(f"{raw + offsets.get(s, 0)}\n")
        readings = backend.sample().readings
        counted += meter.feed(Snapshot(s + 1, clock.monotonic(), clock.wall(), devices, readings)).joules.get(
            PACKAGE, 0.0)
        powers.append((s, readings[f"{PACKAGE}/power"]))
    backend.close()
    return counted, truth, powers


@pytest.mark.parametrize("name", GLITCHES)
def test_a_jump_of_energy_uj_is_never_counted_nor_published_however_many_reads_it_lasts(tmp_path, name):
    root = copy_machine(tmp_path, "node-exporter-sys-class-powercap-intel-rapl.ttar")
    offsets, lost = GLITCHES[name]
    counted, truth, powers = run(root, offsets)
    assert truth == pytest.approx(2950.0)
    assert counted == pytest.approx(truth - lost)  # J: the 50 W the package drew, nothing of the +4 kJ
    published = {round(p.value, 6) for s, p in powers if p.status is Status.OK}
    assert published == {50.0}  # W: no 2 050 W "ok" reading of a 95 W zone
    assert powers[30][1].status is Status.STALE  # held
    assert powers[-1][1].status is Status.OK and powers[-1][1].value == pytest.approx(50.0)


def test_a_real_surge_over_the_bar_is_counted_in_full_and_becomes_the_zones_rate(tmp_path):
    """PL2 or an "unlimited" board: 300 W from t=30 on a 95 W zone; two reads agree on it."""
    root = copy_machine(tmp_path, "node-exporter-sys-class-powercap-intel-rapl.ttar")
    counted, truth, powers = run(root, {}, lambda s: 300.0 if s >= 30 else 50.0)
    assert counted == pytest.approx(truth) == pytest.approx(29 * 50.0 + 30 * 300.0)
    assert powers[30][1].status is Status.STALE  # W: the first read over the bar is held
    assert [p.value for s, p in powers[31:]] == pytest.approx([300.0] * 29)
