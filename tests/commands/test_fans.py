"""``aithermd fans`` as people and systemd run it: on the simulated workstation, its output and stored result,
refused beside a running daemon (and a daemon refused beside it), usage errors, and a SIGKILL in the
middle of a detection: ``aithermd restore`` puts every pwm back (the journal was written before the first
one was touched)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aithermd.actuate.journal import Journal

ROOT = Path(__file__).resolve().parents[2]


def aithermd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aithermd", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_calibrate_on_the_simulated_workstation_stores_what_it_found_and_show_prints_it(tmp_path):
    state = tmp_path / "state"
    out = aithermd("fans", "calibrate", "--simulate", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    assert "hwmon:nct6798-isa-0290/pwm2 drives fan2 (" in out.stdout and "fan5 (" in out.stdout
    assert "hwmon:nct6798-isa-0290/fan6 reads 0 RPM throughout: nothing connected" in out.stdout
    assert f"saved to {state / 'fans.json'}" in out.stdout
    stored = json.loads((state / "fans.json").read_text())
    pwm2 = stored["pwms"]["hwmon:nct6798-isa-0290/pwm2"]
    assert pwm2["tachs"] == ["hwmon:nct6798-isa-0290/fan2", "hwmon:nct6798-isa-0290/fan5"]
    assert 15.0 <= pwm2["stop_pct"] < 16.0 and 25.0 <= pwm2["start_pct"] < 26.0 and pwm2["calibrated"]
    assert stored["idle"] == ["hwmon:nct6798-isa-0290/fan6"]
    assert not Journal(state).dirty
    shown = aithermd("fans", "show", "--state-dir", str(state))
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["pwm", "fan", "inputs", "starts", "stops", "full", "speed", "levels"]
    assert any(line.startswith("hwmon:nct6798-isa-0290/pwm5") and "(empty header)" in line for line in lines)
    assert json.loads(aithermd("fans", "show", "--json", "--state-dir", str(state)).stdout) == stored


def test_it_refuses_beside_a_running_daemon_and_a_daemon_refuses_to_start_beside_it(tmp_path):
    """One owner of a state directory's fans (the daemon's locks, runtime/instance.py): a detection beside a
    running daemon is refused, and a daemon started while a detection steps the fans refuses to start (it
    would restore the pwms under the detection's feet and then drive them)."""
    state = tmp_path / "state"
    sim = ["--simulate", "--state-dir", str(state)]
    quiet = ["--bus", "none", "--metrics-listen", "none", "--log-format", "json"]
    daemon = subprocess.Popen([sys.executable, "-m", "aithermd", "run", *sim, *quiet, "--speedup", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        lock = state / "aithermd.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip() == str(daemon.pid)):
            assert time.monotonic() < deadline and daemon.poll() is None, "the daemon never took its lock"
            time.sleep(0.05)
        out = aithermd("fans", "detect", *sim)
    finally:
        daemon.terminate()
        daemon.wait(60)
    assert out.returncode == 1, out.stdout
    assert f"another aithermd (pid {daemon.pid}) is running" in out.stderr and "stop it first" in out.stderr
    assert not (state / "fans.json").exists()

    session = subprocess.Popen([sys.executable, "-m", "aithermd", "fans", "detect", *sim, "--speedup", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert session.stdout is not None
        for line in session.stdout:  # the detection is stepping the fans now
            if "0 % for a few seconds" in line:
                break
        out = aithermd("run", *sim, *quiet, "--duration", "5")
        assert out.returncode == 1
        assert '"event": "already_running"' in out.stderr and f"(pid {session.pid})" in out.stderr
    finally:
        session.send_signal(signal.SIGTERM)
        _, err = session.communicate(timeout=60)
    assert session.returncode == 1 and "every pwm restored" in err
    assert not Journal(state).dirty


@pytest.mark.parametrize("args", [["fans"], ["fans", "detect", "--margin", "0"],
                                  ["fans", "calibrate", "--time-limit", "-1"]])
def test_usage_errors_exit_2(args):
    assert aithermd(*args).returncode == 2


def test_without_a_terminal_it_asks_for_yes_before_stopping_real_fans(tmp_path):
    out = aithermd("fans", "detect", "--sysfs-root", str(tmp_path), "--state-dir", str(tmp_path / "s"))
    assert out.returncode == 2 and "give --yes" in out.stderr  # a usage error, as the other flags


def test_a_sigkill_in_the_middle_of_a_detection_is_put_right_by_aithermd_restore(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "aithermd", "fans", "detect", "--simulate", "--speedup",
                             "10", "--state-dir", str(state)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # kill it while pwm2 (the CPU fans) is at 0 %
            seen.append(line)
            if "nct6798-isa-0290/pwm2: 0 %" in line:
                time.sleep(0.3)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    journal = Journal(state)
    originals = {e.knob_id: dict(e.saved) for e in journal.entries().values()}
    assert len(originals) == 7  # every pwm was journaled before the first write
    (machine,) = state.glob("sim-machine-*")
    pwm2 = next((machine / "sys").rglob("nct6775.656/hwmon/hwmon1/pwm2"))
    assert int(pwm2.read_text().split()[0]) == 0
    assert int(pwm2.with_name("pwm2_enable").read_text().split()[0]) == 1
    out = aithermd("restore", "--state-dir", str(state), timeout=60)
    assert out.returncode == 0, out.stderr
    assert not Journal(state).dirty
    for n in range(1, 7):  # each back in the chip's automatic mode it was found in
        enable = pwm2.with_name(f"pwm{n}_enable")
        assert int(enable.read_text().split()[0]) == originals[f"hwmon:nct6798-isa-0290/pwm{n}"]["enable"]


def test_sigterm_in_the_middle_of_a_detection_restores_every_pwm_before_exiting(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "aithermd", "fans", "detect", "--simulate", "--speedup",
                             "10", "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "nct6798-isa-0290/pwm3: 0 %" in line:
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "aborted: stopped: SIGTERM; every pwm restored" in err
    assert not Journal(state).dirty and not (state / "fans.json").exists()


def test_a_machine_without_pwms_is_said_so_not_blamed_on_root(tmp_path):
    """newuser8: `fans detect` as root on a host without hwmon said "no writable pwm (root needed?)"; it
    reads this machine's own sysfs (not a demo's bus), and there is nothing to drive there."""
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "hwmon").mkdir(parents=True)
    out = aithermd("fans", "detect", "--yes", "--sysfs-root", str(sysfs), "--state-dir", str(tmp_path / "st"))
    assert out.returncode == 1
    assert out.stderr.startswith(f"aithermd fans: no hwmon pwm under {sysfs}: this machine has no fan header "
                                 "it can drive (detection runs on this machine's own sysfs, never on a daemon's "
                                 "or a demo's: --simulate runs it on the simulated workstation)")
    assert "root needed" not in out.stderr
