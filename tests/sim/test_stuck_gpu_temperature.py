"""attack5 C1 on the simulated workstation: the shipped ai-training policy with a 45 °C GPU ceiling the load
reaches, and gpu0's NVML temperature frozen at 40 °C from 1:40 on (a driver returning its last cached value)
while its critical cut is being released. Before, the release ramp stepped the cut from 208 W to 598 W on
the frozen reading while the die passed its trip point. Now a step needs a reading that moved since the last
one, and once the draw moves under the frozen reading it is a confirmed failed sensor: its fans go to full
and the ramp goes back to its cut."""

from __future__ import annotations

from conftest import SEED, hot_policy, run_daemon

from aithermd.sim.workload import CycleWorkload

KNOB, FROZEN_AT_S, FROZEN_C = "gpu0/power_limit", 100.0, 40.0


def _freeze(daemon, machine) -> None:
    """Every NVML temperature read of gpu0 returns 40 °C from FROZEN_AT_S on (the physics goes on)."""
    nvml, first = machine.nvml, machine.nvml.gpus[0].bus_id
    read = nvml._dev

    def dev(handle, fname):
        g = read(handle, fname)
        frozen = machine.t_s >= FROZEN_AT_S and "Temperature" in fname and "Threshold" not in fname
        if g.bus_id == first and frozen:
            g.temp_c = FROZEN_C
        return g

    nvml._dev = dev


def test_a_frozen_gpu_temperature_releases_no_cut_and_is_found_failed_once_the_draw_moves(tmp_path):
    fans: list[tuple[float, str]] = []

    def watch(snapshot, events):
        d = snapshot.decisions.get("gpu0/fan0")
        if d is not None:
            fans.append((snapshot.t_mono, d.rule))

    run = run_daemon(tmp_path, "hot", 720.0, CycleWorkload(30, 660, 30, seed=SEED), on_daemon=_freeze,
                     listeners=[watch], policy_dirs=[hot_policy(tmp_path, 45)]).data
    moves = [(a["t_s"], a["new"], a["rule"]) for a in run["actuations"] if a["knob"] == KNOB]
    cut = [m for m in moves if m[2] == "safety/critical-temperature" and m[0] < FROZEN_AT_S]
    assert cut, f"gpu0 never tripped before its sensor froze: nothing was tested ({moves})"
    before = [w for t, w, _r in moves if t <= FROZEN_AT_S + 1.0]
    step = 0.05 * run["gpus"]["gpu0"]["max_limit_w"]
    later = [(t, w, r) for t, w, r in moves if t > FROZEN_AT_S + 1.0]
    assert all(w <= before[-1] + step + 0.01 for _t, w, _r in later), moves  # was: stepped up to 598 W
    assert "safety/failed-source" in {rule for _t, rule in fans[-30:]}, fans[-30:]  # found failed: full
