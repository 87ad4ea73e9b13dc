"""The simulation summary says why each limit and clock moved: a search whose job ended says the job ended
(it said 'progress signal or power unreadable'), a clock lock released when work returns is listed, and
each GPU's 'changes' counts its power-limit and clock changes alike."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from conftest import NOON, SEED

from aithermd.model import Event, PolicyStatus, Reading, Snapshot
from aithermd.policy import efficient
from aithermd.policy.efficient import REVERTED, Spec
from aithermd.sim import report
from aithermd.sim.recorder import Recorder


def _readings(util, power=300.0, progress=None):
    out = {"gpu0/power": Reading("gpu0/power", power), "gpu0/utilization": Reading("gpu0/utilization", util),
           "gpu0/sm_clock": Reading("gpu0/sm_clock", 2500.0)}
    if progress is not None:
        out["gpu0/progress_rate"] = Reading("gpu0/progress_rate", progress)
    if power is None:
        del out["gpu0/power"]
    return out


@pytest.mark.parametrize("util, power, why", [
    (2.0, 40.0, "the job ended (no progress signal, the GPU idle at 2 %): back to the default limit"),
    (95.0, 300.0, "progress signal (the job stopped reporting its progress) unreadable while the GPU works: "
                  "back to the default limit"),
    (95.0, None, "power unreadable while the GPU works: back to the default limit"),
])
def test_a_search_that_loses_its_signal_says_why(util, power, why):
    spec = Spec()
    s = efficient.start(spec, "gpu0", 0.0, 450.0, _readings(95.0, progress=12.0))
    assert s.signal == "progress"
    s = efficient.step(spec, s, "gpu0", 10.0, _readings(util, power), {}, 150.0, 450.0)
    assert s.phase == REVERTED and s.why == why


def _snap(t, state):
    states = MappingProxyType({"balanced": {"gpu0": state}})
    return Snapshot(seq=1, t_mono=t, t_wall=t, policy=PolicyStatus(active="balanced", states=states))


def test_a_clock_lock_handed_back_is_listed_with_why_and_counted():
    rec = Recorder(t0=100.0)
    lock = Event("actuation", 0.0, "gpu0/sm_clock_lock", "", {"old": 3120.0, "new": 210.0, "unit": "MHz",
                                                              "rule": "balanced/held-idle-clocks"})
    back = Event("restore", 0.0, "gpu0/sm_clock_lock", "gpu0/sm_clock_lock handed back: original restored",
                 {"device": "gpu0", "unit": "MHz"})
    fan = Event("restore", 0.0, "hwmon:nct/pwm1", "hwmon:nct/pwm1 handed back: original restored", {})
    rec(_snap(161.0, "idle"), [lock])
    rec(_snap(281.0, "idle"), [back, fan])  # a knob never written here (no actuation seen) is not listed
    assert rec.actuations[1] == {
        "t_s": 181.0, "knob": "gpu0/sm_clock_lock", "old": 210.0, "new": 3120.0, "unit": "MHz", "rule": None,
        "reason": "no rule decides it now (balanced: gpu0 idle): handed back as found (original restored)"}
    assert len(rec.actuations) == 2
    limit = {"t_s": 1.0, "knob": "gpu0/power_limit", "old": 450.0, "new": 315.0, "unit": "W",
             "rule": "balanced/idle-limit", "reason": "gpu0 in load.idle"}
    gpu = {"name": "NVIDIA GeForce RTX 4090", "energy_j": 1000.0, "work": 1.0, "work_per_kj": 1.0,
           "peak_temp_c": 40.0, "final_limit_w": 450.0, "default_limit_w": 450.0, "max_limit_w": 600.0,
           "limit_changes": [[1.0, 450.0, 315.0]]}
    data = {"policy": "balanced", "duration_s": 300.0, "gpus": {"gpu0": gpu}, "gpu_energy_j": 1000.0,
            "cpu_energy_j": 0.0, "energy_j": 1000.0, "work": 1.0, "work_per_kj": 1.0, "peak_cpu_c": 40.0,
            "peak_case_c": 30.0, "actuations": [limit, *rec.actuations]}
    text = report.format_summary(data)
    row = next(line for line in text.splitlines() if line.startswith("gpu0 "))
    assert row.split()[-1] == "3"  # one power-limit change, a clock locked and released
    header = text.splitlines()[3]  # the GPU's own throttle temperature (NVML's slowdown threshold), not a slowdown
    assert "peak °C  throttle °C" in header and "slowdown" not in header
    assert "changes: each GPU's power-limit and clock changes, listed below" in text
    assert "power-limit and clock changes (3), each with its reason:" in text
    assert "     3:01  gpu0/sm_clock_lock           210 → 3120 MHz" in text
    assert "no rule decides it now (balanced: gpu0 idle): handed back as found (original restored)" in text


def test_a_dry_run_summary_says_nothing_was_written_and_no_op_changes_are_not_counted(tmp_path):
    """--dry-run listed '450 → 282 W' as changes and said the daemon 'put every limit back'; an actuation
    that left its knob where it was ('450 → 450 W') was listed and counted as a change."""
    import asyncio

    from aithermd.settings import DaemonSettings
    from aithermd.sim.runner import SimOptions, simulate
    from aithermd.sim.workload import CycleWorkload

    settings = DaemonSettings(policy="balanced", policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error", dry_run=True)
    opts = SimOptions(duration_s=600.0, speedup=0, seed=SEED, wall_start=NOON,
                      workload=CycleWorkload(seed=SEED), state_dir=tmp_path / "state")
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0 and result.data["dry_run"] is True
    assert all(g["limit_changes"] == [] for g in result.data["gpus"].values()), "nothing reached the cards"
    text = report.format_summary(result.data)
    assert "a dry run: the daemon wrote nothing, so it had nothing to put back" in text
    assert "power-limit and clock changes (" in text
    assert ") decided, not written, each with its reason:" in text
    data = {**result.data, "actuations": [
        {"t_s": 1.0, "knob": "gpu0/power_limit", "old": 450.0, "new": 450.0, "unit": "W", "rule": "r"},
        {"t_s": 2.0, "knob": "gpu0/power_limit", "old": 450.0, "new": 300.0, "unit": "W", "rule": "r"}]}
    lines = report.format_summary(data).splitlines()
    at = lines.index("power-limit and clock changes (1) decided, not written, each with its reason:")
    assert lines[at + 1] == "     0:02  gpu0/power_limit             450 → 300 W  r"


def test_a_fault_lasts_to_the_end_when_its_last_change_is_on():
    data = {"faults": [{"t_s": 10.0, "fault": "on", "spec": "gpu0:UNKNOWN@10s-20s"},
                       {"t_s": 20.0, "fault": "off", "spec": "gpu0:UNKNOWN@10s-20s"},
                       {"t_s": 30.0, "fault": "on", "spec": "gpu1:GPU_IS_LOST@30s-99h"}]}
    assert report.lasting_faults(data) == {"gpu1:GPU_IS_LOST@30s-99h": 30.0}
    data["gpus"] = {"gpu1": {"work_per_j_gain_pct": 1.0, "slowdown_pct": 0.5}}
    report.leave_out_lost(data)
    assert data["gpus"]["gpu1"] == {"lost_at_s": 30.0}, "lost until the run ended, though the spec has an end"
