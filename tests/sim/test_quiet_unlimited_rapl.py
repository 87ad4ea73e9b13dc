"""attack5 C6 on the simulated workstation: the recorded RAPL zone's firmware limits ("unlimited": PL1/PL2
4090 W over a 95 W constraint maximum, what most Z690/Z790 boards ship), a package drawing 300 W, board fans
on a Tctl curve under a 20 % quiet ceiling. Quiet's band was taken on 4090 W: "98 % of 4090 W" was written
as 95 W, the package fell 300 → 95 W, the pressure went and 4090 W was handed back the next tick — PL1
flapped 4090 ↔ 95 W 19 times in 34 s. Now the band is on what the knob can hold (95 W) and a limit asked
above its maximum is held there for HANDBACK_S after quiet last pressed it."""

from __future__ import annotations

from conftest import SEED, run_daemon

from aithermd.sim import board
from aithermd.sim.workload import CycleWorkload

PL1 = "powercap:package-0/pl1"
HOTCPU = """
curves:
  board:
    kind: points
    source: {max: [{first: [[Tctl, Tdie]]}]}
    points: [[40, 20], [70, 50], [85, 100]]
quiet:
  fans:
    - {fans: {chip: ["nct*"]}, max_duty_pct: 20}
rules:
  - {name: f, kind: fan, fans: {chip: ["nct*"]}, curve: board, min_duty_pct: 20}
"""


def test_quiet_on_a_package_at_firmwares_unlimited_limits_does_not_flap(tmp_path, monkeypatch):
    monkeypatch.setattr(board, "_set_desktop_rapl_limits", lambda root: None)  # keep the recorded 4090 W
    monkeypatch.setattr(board, "CPU_IDLE_W", 299.0)
    monkeypatch.setattr(board, "CPU_PEAK_W", 300.0)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hotcpu.yaml").write_text(HOTCPU)
    run = run_daemon(tmp_path, "hotcpu", 300.0, CycleWorkload(30, 600, 30, seed=SEED),
                     policy_dirs=[tmp_path / "policies"]).data
    writes = [(a["t_s"], a["old"], a["new"]) for a in run["actuations"] if a["knob"] == PL1]
    assert writes and writes[0][1] > 4000.0 and writes[0][2] <= 95.0, writes  # quiet did press it
    handed_back = [w for w in writes if w[2] > 95.0]
    assert handed_back == [], writes  # was: 95 → 4090 W every other tick
    ups = [w for w in writes if w[2] > w[1]]
    assert len(ups) <= 2, writes  # a band that settles, not a bang-bang: it rises at most twice in 5 min
