"""``aithermd run`` as a real process on a copy of a recorded machine, with the shipped policies."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from aithermd.actuate.journal import JOURNAL_FILE
from tests.support.machines import copy_machine
from tests.support.proc import (
    NotifySocket,
    catches,
    json_lines,
    knob_files,
    restore,
    run_args,
    start,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def machine(tmp_path):
    root = copy_machine(tmp_path)
    return root, tmp_path / "state", knob_files(root)


def test_run_takes_the_fans_under_control_and_sigterm_puts_them_back(machine, tmp_path):
    root, state, original = machine
    assert any(v.strip() not in ("1",) for k, v in original.items() if k.endswith("_enable"))
    notify = NotifySocket(tmp_path)
    proc = start(run_args(root, state, "--tick", "0.2"), env={"NOTIFY_SOCKET": str(notify.path)})
    try:
        ready = notify.wait_for("READY=1")
        assert "STATUS=policy balanced" in ready
        controlled = knob_files(root)
        manual = [k for k, v in controlled.items() if k.endswith("_enable") and v.strip() == "1"]
        assert len(manual) >= 6, controlled  # the nct6798's six fans
        assert (state / JOURNAL_FILE).exists()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert knob_files(root) == original
    assert not (state / JOURNAL_FILE).exists()
    acts = [e for e in json_lines(err) if e["event"] == "actuation"]
    assert acts, err
    for e in acts:
        assert {"device", "knob", "old", "new", "unit", "rule"} <= set(e)
        assert isinstance(e["new"], float) and isinstance(e["old"], float)
        # the board's pwms, and the amdgpu's own fan (gpu0, read through hwmon) by the GPU fan curve
        assert e["knob"].startswith("hwmon:nct6798-isa-0290/pwm") or e["knob"] == "gpu0/fan0", e
        assert e["rule"].startswith("balanced/")
    assert any(e["knob"].startswith("hwmon:nct6798-isa-0290/pwm") for e in acts)


KILL_POINTS = ("start-up", "journaled", "steady")


def kill_point(proc, point: str, root, state, original, rng) -> None:
    """Wait for the moment ``point`` names, by what the daemon does (never by a duration): ``start-up`` at
    once, ``journaled`` when the journal appears (the first write is under way or done), ``steady`` a
    random 0–0.5 s after a knob changed."""
    if point == "journaled":
        wait_until(lambda: (state / JOURNAL_FILE).exists() or proc.poll() is not None, what="journal")
    elif point == "steady":
        wait_until(lambda: knob_files(root) != original or proc.poll() is not None, what="a write")
        time.sleep(rng.uniform(0.0, 0.5))


def test_kill_9_at_random_points_then_restore_puts_every_pwm_and_mode_back(machine, tmp_path):
    root, state, original = machine
    seed = int(os.environ.get("AITHERMD_KILL_SEED", "5"))
    rng = random.Random(seed)
    after_a_write = 0
    for round_ in range(12):
        point = KILL_POINTS[round_ % 3] if round_ < 3 else rng.choice(KILL_POINTS)
        proc = start(run_args(root, state, "--tick", "0.05"), stderr=subprocess.DEVNULL)
        kill_point(proc, point, root, state, original, rng)
        assert proc.poll() is None, f"round {round_}: the daemon ended by itself"
        proc.kill()
        proc.wait(timeout=30)
        if point == "steady":
            after_a_write += 1
            assert knob_files(root) != original  # killed with the fans taken: nothing restored them
        if round_ % 3 == 2:
            # the next start restores the dirty journal itself; then a clean stop once it runs
            notify = NotifySocket(tmp_path)
            try:
                again = start(run_args(root, state, "--tick", "0.05"), stderr=subprocess.DEVNULL,
                              env={"NOTIFY_SOCKET": str(notify.path)})
                notify.wait_for("READY=1")
                again.send_signal(signal.SIGINT if round_ % 2 else signal.SIGTERM)  # Ctrl-C restores too
                assert again.wait(timeout=60) == 0
            finally:
                notify.close()
                notify.path.unlink()
        else:
            result = restore(state)
            assert result.returncode == 0, result.stderr
        assert knob_files(root) == original, f"seed {seed}, round {round_} ({point})"
        assert not (state / JOURNAL_FILE).exists()
    assert after_a_write >= 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_start_up_restores_and_exits_0(machine, sig):
    """A crashed run left the fans taken; the next start is stopped as soon as it can hear signals, before
    its first tick: it restores what the crash left (and whatever it wrote itself) and exits 0."""
    root, state, original = machine
    crashed = start(run_args(root, state, "--tick", "0.05"), stderr=subprocess.DEVNULL)
    wait_until(lambda: knob_files(root) != original, what="a write")
    crashed.kill()
    crashed.wait(timeout=30)
    assert (state / JOURNAL_FILE).exists()
    proc = start(run_args(root, state, "--tick", "0.05"))
    wait_until(lambda: catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, what="handlers")
    proc.send_signal(sig)  # start-up has only begun: the interpreter is still importing the daemon
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert knob_files(root) == original
    assert not (state / JOURNAL_FILE).exists()
    events = [e["event"] for e in json_lines(err)]
    assert "stop" in events and "KeyboardInterrupt" not in err
    assert "actuation" not in events  # stopped before its first tick


def test_dry_run_writes_nothing(machine, tmp_path):
    root, state, original = machine
    notify = NotifySocket(tmp_path)
    proc = start(run_args(root, state, "--tick", "0.1", "--dry-run"), env={"NOTIFY_SOCKET": str(notify.path)})
    try:
        notify.wait_for("READY=1")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        notify.close()
    assert proc.returncode == 0
    assert knob_files(root) == original  # nothing restored at the end either: nothing was written
    assert not (state / JOURNAL_FILE).exists()
    acts = [e for e in json_lines(err) if e["event"] == "actuation"]
    assert acts and all(e["dry_run"] is True for e in acts)


def test_sighup_with_a_broken_policy_keeps_the_old_ones(machine, tmp_path):
    root, state, _ = machine
    mine = tmp_path / "policies"
    mine.mkdir(mode=0o755)
    from aithermd.policy.loader import shipped_policy_dir
    text = (shipped_policy_dir() / "quiet.yaml").read_text()
    (mine / "mine.yaml").write_text(text)
    notify = NotifySocket(tmp_path)
    log = tmp_path / "stderr.log"
    with open(log, "w") as sink:
        proc = start(run_args(root, state, "--tick", "0.1", "--policy-dir", str(mine), "--policy", "mine"),
                     env={"NOTIFY_SOCKET": str(notify.path)}, stderr=sink)
    try:
        assert "policy mine" in notify.wait_for("READY=1")
        (mine / "mine.yaml").write_text(text + "\nrules:\n  - kind: fan\n    name: x\n    bogus_key: 1\n")
        proc.send_signal(signal.SIGHUP)
        for _ in range(600):  # until the reload was tried (next tick), up to 60 s on a loaded machine
            if "reload_refused" in log.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None  # still running
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    assert proc.returncode == 0, err
    lines = json_lines(err)
    failed = [e for e in lines if e["event"] == "reload_failed"]
    assert failed and all(e["error"].startswith(f"{mine / 'mine.yaml'}:") for e in failed)
    assert all(isinstance(e["line"], int) for e in failed)
    assert any(e["event"] == "reload_refused" for e in lines)
    acts = [e for e in lines if e["event"] == "actuation"]
    assert acts and all(e["rule"].startswith("mine/") for e in acts)


def gpu_state(path) -> list[tuple]:
    """Each fake GPU's control state: power limit (W) and every fan's (auto, target %)."""
    from aithermd.sim.fake_nvml import FakeNvml
    fake = FakeNvml.open(path)
    return [(fake.power_limit_w(i), tuple((fake.fan_auto(i, f), fake.fan_target_pct(i, f))
                                         for f in range(fake.fan_count(i)))) for i in range(len(fake.gpus))]


def test_kill_9_on_the_fake_nvml_then_restore_puts_every_gpu_back(machine, tmp_path):
    import sys
    from pathlib import Path

    from aithermd.sim.fake_nvml import FakeNvml
    root, state, original = machine
    profiles = Path(__file__).resolve().parents[2] / "aithermd" / "data" / "gpu-profiles"
    nvml_state = tmp_path / "nvml-state.json"
    FakeNvml.from_dumps([profiles / "rtx4090-nvidia-smi-q-x-driver535.xml",
                         profiles / "rtx3090-nvidia-smi-q-x-driver-v13.xml"],
                        state_path=nvml_state, fan_count=2)
    gpus_before = gpu_state(nvml_state)
    policies = Path(__file__).resolve().parents[1] / "fixtures" / "policies" / "daemon"
    script = Path(__file__).with_name("gpu_daemon.py")
    args = [sys.executable, str(script), str(root), str(state), str(nvml_state), str(policies)]
    rng = random.Random(int(os.environ.get("AITHERMD_KILL_SEED", "7")))
    touched = 0
    for round_ in range(8):
        proc = start(args, stderr=subprocess.DEVNULL)
        if round_ % 2:  # once the GPUs were taken, at a random point of the steady state
            wait_until(lambda p=proc: gpu_state(nvml_state) != gpus_before or p.poll() is not None,
                       what="a write")
            time.sleep(rng.uniform(0.0, 0.5))
        else:  # anywhere from start-up on
            time.sleep(rng.uniform(0.0, 1.0))
        assert proc.poll() is None, f"round {round_}: the daemon ended by itself"
        proc.kill()
        proc.wait(timeout=30)
        if gpu_state(nvml_state) != gpus_before:
            touched += 1
        result = restore(state)
        assert result.returncode == 0, result.stderr
        assert gpu_state(nvml_state) == gpus_before, f"round {round_}"
        assert knob_files(root) == original, f"round {round_}"
    assert touched >= 4  # every other round killed it with the GPUs taken
