"""``aithermd run --simulate --fault SPEC``: the specs, their refusals, and faults that reach the daemon's
real backends (the fake NVML beneath pynvml, the board's sysfs files) at their simulated time."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest
from conftest import NOON, SEED, run_daemon

from aithermd.sim.faults import FaultSpecError, parse


def test_specs_parse_into_targets_faults_and_times():
    lost = parse("gpu1:GPU_IS_LOST@120s")
    assert (lost.target, lost.gpu, lost.kind, lost.value, lost.start, lost.end) == (
        "gpu", 1, "code", 15, 120, None)
    unknown = parse("gpu0:UNKNOWN@1m-90s")
    assert (unknown.value, unknown.start, unknown.end) == (999, 60, 90)
    one = parse("gpu0/DeviceGetPowerUsage:NO_DATA@2h")
    assert (one.function, one.value, one.start) == ("nvmlDeviceGetPowerUsage", 21, 7200)
    assert parse("nvml:LIB_RM_VERSION_MISMATCH@10m-12m").target == "nvml"
    assert (parse("gpu0:HANG@5s-6s").kind, parse("gpu1:ABSENT@0s-1h").kind) == ("hang", "absent")
    assert (parse("gpu0:CAP=200W@30s").kind, parse("gpu0:CAP=200W@30s").value) == ("cap", 200.0)
    day = parse("gpu1:GPU_IS_LOST@2h-2h30m")  # several units, as an admin writes a time of day
    assert (day.start, day.end) == (7200, 9000)
    assert (parse("gpu0:HANG@1m30s-2m").start, parse("gpu0:HANG@60-90").end, parse("gpu0:HANG@1-2m").end) == (
        90, 90, 120)
    board = parse("hwmon:nct6798-isa-0290/temp2:EIO@30s")
    assert (board.target, board.channel, board.value) == ("file", "hwmon:nct6798-isa-0290/temp2", errno.EIO)


@pytest.mark.parametrize(("spec", "says"), [
    ("gpu1:GPU_IS_LOST", "no @WHEN"),
    ("gpu1:GPU_IS_LOST@soon", "is no time"),
    ("gpu1:GPU_IS_LOST@2h30", "is no time"),
    ("gpu1:GPU_IS_LOST@90s-60s", r"ends \(60 s\) before it starts"),
    ("gpu1:GPU_IS_LOST@10s-10s", r"ends as it starts \(10 s\): give an end after the start"),
    ("gpu0/nvmlDeviceGetFoo:UNKNOWN@5s", "'nvmlDeviceGetFoo' is no NVML device function"),
    ("gpu0/Init:UNKNOWN@5s", "'Init' is no NVML device function"),
    ("gpu\u0660:UNKNOWN@5s", "is no target"),
    ("gpu1:FELL_OFF@1s", "is no NVML error; use one of"),
    ("tpu0:UNKNOWN@1s", "is no target"),
    ("nvml:HANG@1s", "per GPU"),
    ("hwmon:nct6798-isa-0290/temp2:EBROKEN@1s", "no errno name"),
    ("gpu0:CAP=abc@10s", r"'CAP=abc' is no power cap: CAP=WATTS, a number of watts \(CAP=200 or CAP=200W\)"),
])
def test_a_bad_spec_says_what_is_wrong(spec, says):
    with pytest.raises(FaultSpecError, match=says):
        parse(spec)


@pytest.mark.parametrize(("fault", "says"), [
    ("gpu1:UNKNOWN@1s-", "is no time"),
    ("gpu7:GPU_IS_LOST@10s", "has 2 GPUs"),
    ("hwmon:nct6798-isa-0290/temp99:EIO@10s", "has no channel hwmon:nct6798-isa-0290/temp99"),
])
def test_the_command_line_refuses_a_bad_fault_with_exit_2(tmp_path, fault, says):
    done = subprocess.run([sys.executable, "-m", "aithermd", "run", "--simulate", "--duration", "60",
                           "--speedup", "0", "--state-dir", str(tmp_path), "--fault", fault],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_faults_reach_the_real_backends_at_their_time(tmp_path):
    from aithermd.sim.faults import parse_all

    seen: list = []

    def watch(snapshot, events):
        seen.append((snapshot.t_mono, snapshot.health["nvml"]["gpus"]["gpu1"]["state"],
                     snapshot.readings["hwmon:nct6798-isa-0290/temp2"].status, list(events)))

    result = run_daemon(tmp_path, "balanced", 300.0, listeners=[watch], faults=parse_all([
        "gpu1:GPU_IS_LOST@60s-180s", "hwmon:nct6798-isa-0290/temp2:EIO@30s-90s"]))
    t0 = seen[0][0]
    state = {round(t - t0): s for t, s, _, _ in seen}
    assert state[50] == "ok" and state[70] == "lost" and state[290] == "ok", "lost at 60 s, back after 180 s"
    temp2 = {round(t - t0): str(st) for t, _, st, _ in seen}
    assert temp2[20] == "ok" and temp2[60] == "failed" and temp2[120] == "ok"
    faults = [e.subject for *_, evs in seen for e in evs if e.kind == "fault"]
    assert "gpu1" in faults and "hwmon:nct6798-isa-0290/temp2" in faults
    assert [(f["t_s"], f["fault"]) for f in result.data["faults"]] == [
        (30.0, "on"), (60.0, "on"), (90.0, "off"), (180.0, "off")]


def test_a_run_shows_its_faults_as_they_happen_and_in_its_summary_and_warns_of_one_too_late(tmp_path):
    """Injected faults were only in the log and --summary-json; one after the end never happened, silently."""
    done = subprocess.run([sys.executable, "-m", "aithermd", "run", "--simulate", "--duration", "60",
                           "--speedup", "0", "--state-dir", str(tmp_path), "--log-level", "error",
                           "--fault", "gpu0:UNKNOWN@20s-40s", "--fault", "hwmon:nct6798-isa-0290/temp2:EIO@30s",
                           "--fault", "gpu1:GPU_IS_LOST@5m"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.splitlines()[0] == ("aithermd run --simulate: warning: --fault gpu1:GPU_IS_LOST@5m starts "
                                           "at 5:00, after the run's 1:00 (--duration): it never happens")
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("[") and " fault " in line] == [
        "[   0:20] fault on   gpu0:UNKNOWN@20s-40s",
        "[   0:30] fault on   hwmon:nct6798-isa-0290/temp2:EIO@30s",
        "[   0:40] fault off  gpu0:UNKNOWN@20s-40s"]
    at = lines.index("faults injected (3 changes):")
    assert lines[at + 1:at + 4] == ["     0:20  on   gpu0:UNKNOWN@20s-40s",
                                    "     0:30  on   hwmon:nct6798-isa-0290/temp2:EIO@30s",
                                    "     0:40  off  gpu0:UNKNOWN@20s-40s"]


def test_a_gpu_lost_for_good_is_not_said_to_be_put_back(tmp_path):
    """gpu1 lost at 2:00 and never back: its limit after exit is the one the daemon set, yet the summary
    said "on exit the daemon put every limit back". Now it names the GPU whose limit was not put back."""
    done = subprocess.run([sys.executable, "-m", "aithermd", "run", "--simulate", "--duration", "5m",
                           "--speedup", "0", "--state-dir", str(tmp_path), "--log-level", "error",
                           "--fault", "gpu1:GPU_IS_LOST@2m"], capture_output=True, text=True, timeout=300)
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("gpu")}
    assert "210 (300/300)" in rows["gpu1"] and "450 (450/600)" in rows["gpu0"]
    (said,) = [line for line in done.stdout.splitlines() if " in all; " in line]
    assert said.endswith("on exit gpu1/fan0, gpu1/power_limit could not be put back")
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(
        "aithermd run --simulate: the daemon stopped with 1: gpu1/fan0, gpu1/power_limit could not be put "
        "back: gpu1 is lost (NVML_ERROR_GPU_IS_LOST) (the fault gpu1:GPU_IS_LOST@2m lasts to the end of the run); "
        "its files stay in ")
    (scored,) = [line for line in done.stdout.splitlines() if line.startswith("  gpu0 ") and "work/J" in line]
    assert scored.endswith("; gpu1 lost at 2:00, not scored")
    # the progress lines stop showing readings of a GPU that is gone (they showed its last ones)
    progress = {line[1:8].strip(): line for line in done.stdout.splitlines()
                if line.startswith("[") and " | " in line}
    assert " | gpu1 " in progress["1:30"] and "°C" in progress["1:30"].split(" | gpu1 ")[1]
    assert progress["2:30"].endswith(" | gpu1 lost") and progress["4:30"].endswith(" | gpu1 lost")


def test_a_gpu_lost_for_good_is_left_out_of_the_score_and_the_total_is_the_others(tmp_path):
    """The card lost at 2:00 ran on in the simulation at its last limit and was scored as if managed; its
    entry now says when it was lost, and the run's gain is gpu0's own (the only GPU scored)."""
    import asyncio

    from aithermd.settings import DaemonSettings
    from aithermd.sim.faults import parse_all
    from aithermd.sim.runner import SimOptions, simulate
    from aithermd.sim.workload import CycleWorkload

    settings = DaemonSettings(policy="balanced", policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error")
    opts = SimOptions(duration_s=300.0, speedup=0, seed=SEED, wall_start=NOON,
                      workload=CycleWorkload(seed=SEED), state_dir=tmp_path / "state",
                      faults=parse_all(["gpu1:GPU_IS_LOST@2m"]))
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 1, "gpu1's limit cannot be put back: the daemon's exit says so"
    data = result.data
    gpu0, gpu1 = data["gpus"]["gpu0"], data["gpus"]["gpu1"]
    assert gpu1["lost_at_s"] == 120.0 and "work_per_j_gain_pct" not in gpu1 and "slowdown_pct" not in gpu1
    assert data["scored_gpus"] == ["gpu0"]
    assert (data["work_per_j_gain_pct"], data["slowdown_pct"]) == (gpu0["work_per_j_gain_pct"],
                                                                   gpu0["slowdown_pct"])


def test_a_gpu_lost_for_a_while_is_still_scored(tmp_path):
    from aithermd.sim.faults import parse_all

    data = run_daemon(tmp_path, "balanced", 300.0, faults=parse_all(["gpu1:GPU_IS_LOST@1m-2m"])).data
    assert "lost_at_s" not in data["gpus"]["gpu1"] and "work_per_j_gain_pct" in data["gpus"]["gpu1"]
    assert "scored_gpus" not in data
