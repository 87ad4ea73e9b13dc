"""attack4 B5 and B10 on the simulated workstation: the shipped ai-training policy with a GPU ceiling the
load reaches, and NVML refusing gpu0's power-limit writes for a while across its first critical-temperature
cut. Before, NVML_ERROR_NO_PERMISSION made the limit read-only for the daemon's life (B5), and
NVML_ERROR_INVALID_ARGUMENT made the bisection inside the refusal learn a "floor" at the limit in force, the
600 W maximum the policy had set, for good (B10): either way no cut was written again and the card trained
on at 600 W over its trip point. Now nothing is written while it is refused (a ``refused`` or
``uncontrollable`` alarm stands), and the cut is written when the refusal ends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import SEED, hot_policy, run_daemon

from aithermd.publish.fan_metrics import FanCollector, StallCounter
from aithermd.sim.faults import parse_all
from aithermd.sim.report import format_summary
from aithermd.sim.workload import CycleWorkload

KNOB = "gpu0/power_limit"
REFUSED_S = (170.0, 200.0)  # across the first cut (2:59 without the fault)


@pytest.mark.parametrize("error, alarm", [("INVALID_ARGUMENT", "uncontrollable"),  # B10: no floor learnt
                                          ("NO_PERMISSION", "refused")])  # B5: not read-only for good
def test_a_safety_cut_refused_for_a_while_is_written_when_the_refusal_ends_with_an_alarm_meanwhile(
        tmp_path, error, alarm):
    alarms: list[tuple[float, str]] = []
    paged: list[float] = []  # when /metrics said so (attack5 C5: the alarm reached no series)
    t0: list[float] = []
    series = f'aithermd_knob_{alarm}{{knob="{KNOB}"}}'

    def watch(snapshot, events):
        t0.append(snapshot.t_mono)
        held = snapshot.alarms.get(KNOB)
        if held is not None:
            alarms.append((snapshot.t_mono - t0[0], held.kind))
        if int(snapshot.t_mono - t0[0]) % 10 == 5:  # a scrape every 10 s
            text = FanCollector(SimpleNamespace(latest=snapshot), StallCounter()).text().decode()
            assert f"{series} 1.0" in text or f"{series} 0.0" in text, "the series exists, at 0 or 1"
            if f"{series} 1.0" in text:
                paged.append(snapshot.t_mono - t0[0])

    run = run_daemon(tmp_path, "hot", 300.0, CycleWorkload(30, 660, 30, seed=SEED), listeners=[watch],
                     policy_dirs=[hot_policy(tmp_path, 62)], faults=parse_all(
                         [f"gpu0/nvmlDeviceSetPowerManagementLimit:{error}@{REFUSED_S[0]:g}s-"
                          f"{REFUSED_S[1]:g}s"])).data
    moves = [(a["t_s"], a["new"], a["rule"]) for a in run["actuations"] if a["knob"] == KNOB]
    raised = [m for m in moves if m[0] < REFUSED_S[0] and m[1] >= 590.0]
    assert raised, f"the policy did not raise the limit before the refusal: nothing was tested ({moves})"
    assert not [m for m in moves if REFUSED_S[0] <= m[0] < REFUSED_S[1]], "nothing is written while refused"
    held = [t for t, kind in alarms if kind == alarm]
    assert held and REFUSED_S[0] <= held[0] < REFUSED_S[1], alarms
    cut = [m for m in moves if m[0] >= REFUSED_S[1] and m[2].startswith("safety/")]
    assert cut and cut[0][0] <= REFUSED_S[1] + 2.0 and cut[0][1] < 400.0, moves  # when it ends
    assert not [t for t, kind in alarms if t > cut[0][0] + 1.0], "the alarm ends"
    assert paged and REFUSED_S[0] <= min(paged) and max(paged) < cut[0][0] + 1.0, (paged, cut[0])
    assert not [m for m in moves if m[0] > cut[0][0] and m[1] >= 590.0 and m[2].startswith("safety/")], moves


def test_a_cut_the_driver_takes_only_in_part_is_listed_as_what_the_card_took(tmp_path):
    """A driver refusing limits under 450 W inside its constraints (the F16 floor): the critical cut lands
    at ~450 W, and the summary's change list says so, with the value asked beside it."""
    def floor(daemon, machine):
        machine.nvml.refuse_power_below(0, 450.0)

    result = run_daemon(tmp_path, "hot", 240.0, CycleWorkload(30, 660, 30, seed=SEED), on_daemon=floor,
                        policy_dirs=[hot_policy(tmp_path, 62)])
    cuts = [a for a in result.data["actuations"] if a["knob"] == KNOB and a["rule"].startswith("safety/")]
    assert cuts and cuts[0]["new"] < 449.0 and 450.0 <= cuts[0]["took"] <= 451.0, cuts
    listed = [line for line in format_summary(result.data).splitlines() if "safety/" in line and KNOB in line]
    assert listed and f"→ {cuts[0]['took']:g} W ({cuts[0]['new']:g} W asked)" in listed[0], listed
