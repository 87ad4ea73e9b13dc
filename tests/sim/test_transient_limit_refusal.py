"""attack4 B10 on the simulated workstation: the shipped ai-training policy with a GPU ceiling the load
reaches, and NVML answering NVML_ERROR_INVALID_ARGUMENT to gpu0's power-limit writes for a while across its
first critical-temperature cut. Before, the bisection made inside the refusal learnt a "floor" at the limit
in force (the 600 W maximum the policy had set), for good: the cut was reported written, no cut or lowering
was written again, and the card trained on at 600 W over its trip point. Now nothing is written while it is
refused (an ``uncontrollable`` alarm stands), and the cut is written when the refusal ends."""

from __future__ import annotations

from pathlib import Path

from conftest import SEED, run_daemon

from aithermd.sim.faults import parse_all
from aithermd.sim.report import format_summary
from aithermd.sim.workload import CycleWorkload

KNOB = "gpu0/power_limit"
REFUSED_S = (170.0, 200.0)  # across the first cut (2:59 without the fault)


def test_a_safety_cut_refused_as_invalid_for_a_while_learns_no_floor_and_is_written_when_it_ends(tmp_path):
    policy = (Path(__file__).parents[2] / "policies" / "ai-training.yaml").read_text()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hot.yaml").write_text(
        policy.replace("\nmachines:", "\nsafety: {gpu_temp_limit_c: 62}\n\nmachines:", 1))
    alarms: list[tuple[float, str]] = []
    t0: list[float] = []

    def watch(snapshot, events):
        t0.append(snapshot.t_mono)
        alarm = snapshot.alarms.get(KNOB)
        if alarm is not None:
            alarms.append((snapshot.t_mono - t0[0], alarm.kind))

    run = run_daemon(tmp_path, "hot", 300.0, CycleWorkload(30, 660, 30, seed=SEED), listeners=[watch],
                     policy_dirs=[tmp_path / "policies"], faults=parse_all(
                         [f"gpu0/nvmlDeviceSetPowerManagementLimit:INVALID_ARGUMENT@{REFUSED_S[0]:g}s-"
                          f"{REFUSED_S[1]:g}s"])).data
    moves = [(a["t_s"], a["new"], a["rule"]) for a in run["actuations"] if a["knob"] == KNOB]
    raised = [m for m in moves if m[0] < REFUSED_S[0] and m[1] >= 590.0]
    assert raised, f"the policy did not raise the limit before the refusal: nothing was tested ({moves})"
    assert not [m for m in moves if REFUSED_S[0] <= m[0] < REFUSED_S[1]], "nothing is written while refused"
    held = [t for t, kind in alarms if kind == "uncontrollable"]
    assert held and REFUSED_S[0] <= held[0] < REFUSED_S[1], alarms
    cut = [m for m in moves if m[0] >= REFUSED_S[1] and m[2].startswith("safety/")]
    assert cut and cut[0][0] <= REFUSED_S[1] + 2.0 and cut[0][1] < 400.0, moves  # when it ends
    assert not [t for t, kind in alarms if t > cut[0][0] + 1.0], "the alarm ends"
    assert not [m for m in moves if m[0] > cut[0][0] and m[1] >= 590.0 and m[2].startswith("safety/")], moves


def test_a_cut_the_driver_takes_only_in_part_is_listed_as_what_the_card_took(tmp_path):
    """A driver refusing limits under 450 W inside its constraints (the F16 floor): the critical cut lands
    at ~450 W, and the summary's change list says so, with the value asked beside it."""
    policy = (Path(__file__).parents[2] / "policies" / "ai-training.yaml").read_text()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hot.yaml").write_text(
        policy.replace("\nmachines:", "\nsafety: {gpu_temp_limit_c: 62}\n\nmachines:", 1))

    def floor(daemon, machine):
        machine.nvml.refuse_power_below(0, 450.0)

    result = run_daemon(tmp_path, "hot", 240.0, CycleWorkload(30, 660, 30, seed=SEED), on_daemon=floor,
                        policy_dirs=[tmp_path / "policies"])
    cuts = [a for a in result.data["actuations"] if a["knob"] == KNOB and a["rule"].startswith("safety/")]
    assert cuts and cuts[0]["new"] < 449.0 and 450.0 <= cuts[0]["took"] <= 451.0, cuts
    listed = [line for line in format_summary(result.data).splitlines() if "safety/" in line and KNOB in line]
    assert listed and f"→ {cuts[0]['took']:g} W ({cuts[0]['new']:g} W asked)" in listed[0], listed
