"""``aithermd run --simulate`` as a newcomer and CI run it: real processes, stdout, exit codes, kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aithermd.sim.board import Board
from aithermd.sim.fake_nvml import FakeNvml

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests/fixtures/traces/rtx4090-vlm-workload-padded-10min-idle.csv"
DUMP = ROOT / "tests/fixtures/nvidia-smi-q/rtx4090-nvidia-smi-q-x-driver535.xml"


def aithermd(*args, tmp, **kw):
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "aithermd", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT, **kw)


@pytest.fixture
def tmp(tmp_path):
    d = tmp_path / "tmp"
    d.mkdir()
    return d


def test_a_finite_run_prints_its_summary_and_leaves_nothing_behind(tmp):
    p = aithermd("run", "--simulate", "--duration", "600", "--speedup", "0", "--policy", "ai-training",
                 "--log-level", "error", tmp=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "[   2:00] training" in out  # progress lines as simulated time passes
    assert "gpu0/power_limit" in out and "→ 600 W" in out and "ai-training/training-limit" in out
    assert "aithermd simulation summary — policy ai-training, 10:00 simulated" in out
    assert "time per policy state:" in out
    assert list(tmp.iterdir()) == []  # its temporary state and machine are gone


def test_the_readme_main_command_runs_a_full_cycle_and_ends_by_itself(tmp):
    """``scripts/simulate`` (extra arguments win over its defaults: no waiting here): balanced's search at
    work on the jobs' own progress rates, its steps and their reasons in the summary, against stock."""
    p = subprocess.run([str(ROOT / "scripts/simulate"), "--speedup", "0"], capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(tmp)}, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "[   2:00] training" in out and "[  26:00] idle" in out  # the whole 2/22/2 minute cycle
    assert "aithermd simulation summary — policy balanced, 26:00 simulated" in out
    summary = out.split("aithermd simulation summary", 1)[1]
    for gpu in ("gpu0", "gpu1"):
        steps = [line for line in summary.splitlines() if f"{gpu} in load.busy: efficient limit" in line]
        assert "measuring the job at the default" in steps[0] and "signal progress" in steps[0]
        assert len(steps) >= 3  # baseline, then snap or steps down, then a verdict
        assert any(f"{gpu}/power_limit" in line and "balanced/idle-limit" in line
                   for line in summary.splitlines())  # relaxed when idle
    assert "step down to" in summary and "back off to" in summary
    assert "against stock (the same seed and jobs, every limit at its default): work per joule +" in summary
    assert "daemon log:" in p.stderr and "daemon log:" not in out
    assert [f.name for f in tmp.iterdir() if not f.name.startswith("aithermd-simulate.")] == []


def test_the_main_command_takes_a_trace_instead_of_its_cycle(tmp):
    p = subprocess.run([str(ROOT / "scripts/simulate"), "--speedup", "0", "--trace", str(TRACE),
                        "--gpu-profile", str(DUMP), "--duration", "120", "--summary-json"],
                       capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)}, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(p.stdout.split("\ndaemon log:", 1)[0])
    assert data["policy"] == "balanced" and set(data["gpus"]) == {"gpu0"}


def test_json_summary_is_one_document(tmp):
    p = aithermd("run", "--simulate", "--duration", "300", "--speedup", "0", "--summary-json",
                 "--log-level", "error", tmp=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert data["policy"] == "balanced" and data["duration_s"] == pytest.approx(300, abs=1)
    assert set(data["gpus"]) == {"gpu0", "gpu1"}
    assert data["gpus"]["gpu0"]["name"] == "NVIDIA GeForce RTX 4090"
    assert data["energy_j"] > 0 and data["work"] > 0
    # what --duration's summary must hold: energy, work, work per joule, time per state, limit changes,
    # peak temperatures
    assert data["energy_j"] == pytest.approx(data["gpu_energy_j"] + data["cpu_energy_j"], abs=0.2)
    assert data["work_per_kj"] == pytest.approx(1000 * data["work"] / data["gpu_energy_j"], rel=1e-3)
    assert sum(data["phase_s"].values()) == pytest.approx(300, abs=1)
    assert data["phase_s"]["training"] == pytest.approx(180, abs=1)  # 2 min idle, then training
    for key, per_state in data["policy_states_s"].items():
        assert key.startswith("balanced/gpu") and sum(per_state.values()) == pytest.approx(300, abs=2)
    for gpu in data["gpus"].values():
        assert 30 < gpu["peak_temp_c"] < gpu["slowdown_temp_c"]
        assert gpu["work_per_kj"] == pytest.approx(1000 * gpu["work"] / gpu["energy_j"], rel=1e-3)
    changes = data["gpus"]["gpu0"]["limit_changes"]  # balanced: relaxed at idle, the default under load
    assert [c[2] for c in changes] == [315.0, 450.0]
    assert [a["new"] for a in data["actuations"] if a["knob"] == "gpu0/power_limit"] == [315.0, 450.0]


def test_scripts_simulate_summary_json_is_one_document_on_stdout_comparing_like_with_like(tmp):
    """stdout ended with `daemon log: /tmp/… (50 lines …)` after the document; the top-level `energy_j`
    (GPUs and CPU) sat beside the stock twin's GPU-only `energy_j`; limit changes had no reasons."""
    p = subprocess.run([str(ROOT / "scripts/simulate"), "--summary-json", "--cycle", "60,120,60",
                        "--duration", "240", "--speedup", "0"], capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(tmp)}, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert "daemon log: " in p.stderr
    assert set(data["stock"]) == {"gpu_energy_j", "work", "work_per_kj"}
    stock = data["stock"]
    assert stock["work_per_kj"] == pytest.approx(1000 * stock["work"] / stock["gpu_energy_j"], rel=1e-3)
    assert data["energy_j"] == pytest.approx(data["gpu_energy_j"] + data["cpu_energy_j"], abs=0.2)
    for name in ("gpu0", "gpu1"):
        changes = data["gpus"][name]["limit_changes"]
        acts = [a for a in data["actuations"] if a["knob"] == f"{name}/power_limit"]
        acts = acts[:len(changes)]  # (one the card had not yet seen when the run ended is in actuations only)
        assert [c[:3] for c in changes] == [[a["t_s"], a["old"], a["new"]] for a in acts] and changes
        assert [c[3] for c in changes] == [f"{a['rule']}: {a['reason']}" for a in acts]
        assert changes[0][3] == f"balanced/idle-limit: {name} in load.idle: 70% of the default " \
                                f"({changes[0][2]:.0f} W)"


def test_a_reader_that_goes_away_stops_the_simulation_cleanly_and_leaves_nothing(tmp):
    """`aithermd run --simulate … | head -1` left /tmp/aithermd-sim-* behind (BrokenPipeError on stdout)."""
    p = subprocess.Popen([sys.executable, "-m", "aithermd", "run", "--simulate", "--duration", "3600",
                          "--speedup", "0", "--log-level", "error"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)}, cwd=ROOT)
    first = p.stdout.read(1)  # the reader takes a byte, then goes (as head does)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert first == "[" and p.returncode == 0 and err == ""
    assert list(tmp.iterdir()) == []


def test_without_state_dir_the_default_state_dir_is_never_touched(tmp):
    default = Path("/var/lib/aithermd")
    before = default.exists() and sorted(default.iterdir())
    p = aithermd("run", "--simulate", "--duration", "120", "--speedup", "0", "--log-level", "error", tmp=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    after = default.exists() and sorted(default.iterdir())
    assert before == after


def test_a_real_trace_and_a_dump(tmp):
    p = aithermd("run", "--simulate", "--trace", str(TRACE), "--gpu-profile", str(DUMP), "--duration", "900",
                 "--speedup", "0", "--policy", "ai-training", "--summary-json", "--log-level", "error",
                 tmp=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(p.stdout)
    assert list(data["gpus"]) == ["gpu0"]
    assert data["phase_s"]["training"] > 600
    assert [c[2] for c in data["gpus"]["gpu0"]["limit_changes"]][-1] == 600.0  # the VLM load raised it


def test_a_malformed_trace_is_refused_with_its_line(tmp, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp, utilization.gpu [%]\n"
                   "2026/01/03 15:36:53.507, 1 %\n2026/01/03 15:36:54.507, lots\n")
    p = aithermd("run", "--simulate", "--trace", str(bad), "--duration", "10", "--speedup", "0", tmp=tmp)
    assert p.returncode == 1  # invalid content, as `aithermd replay` exits for the same file (README)
    assert p.stderr.startswith(f"aithermd run --simulate: malformed trace: {bad}:3: utilization.gpu: 'lots' ")
    assert list(tmp.iterdir()) == []  # nothing was started


def test_a_gap_in_the_trace_is_warned_about_with_its_lines(tmp, tmp_path):
    """A logger that stopped for a year: the run goes on (the load before the gap holds), and says so."""
    lines = TRACE.read_text().splitlines()
    gapped = tmp_path / "gap.csv"
    gapped.write_text("\n".join(lines[:51] + [str(int(row[:4]) + 1) + row[4:] for row in lines[51:]]) + "\n")
    p = aithermd("run", "--simulate", "--trace", str(gapped), "--duration", "10", "--speedup", "0",
                 "--log-level", "error", tmp=tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.splitlines()[0] == (
        f"aithermd run --simulate: warning: {gapped}:52: 365 d since the sample of line 51: the log stopped; "
        "the simulated GPUs hold that sample's load for the whole gap")
    p = aithermd("run", "--simulate", "--trace", str(TRACE), "--duration", "10", "--speedup", "0",
                 "--log-level", "error", tmp=tmp)
    assert p.returncode == 0 and "warning" not in p.stderr


def test_a_trace_without_utilization_is_refused(tmp, tmp_path):
    bad = tmp_path / "power.csv"
    bad.write_text("timestamp, power.draw [W]\n2026/01/03 15:36:53.507, 30 W\n")
    p = aithermd("run", "--simulate", "--trace", str(bad), "--duration", "10", "--speedup", "0", tmp=tmp)
    assert p.returncode == 1 and "utilization.gpu" in p.stderr  # its content


def test_an_unreadable_dump_is_refused(tmp, tmp_path):
    p = aithermd("run", "--simulate", "--gpu-profile", str(tmp_path / "missing.txt"), "--duration", "10",
                 tmp=tmp)
    assert p.returncode == 2 and "missing.txt" in p.stderr


def test_an_unknown_policy_is_one_line_naming_the_known_ones_and_leaves_nothing(tmp):
    """`--policy nope` exited 78 after the daemon's log and left its /tmp/aithermd-sim-* behind."""
    p = aithermd("run", "--simulate", "--policy", "nope", "--duration", "10", "--speedup", "0", tmp=tmp)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["aithermd run: --policy nope: no policy named 'nope' (known: ai-training, "
                                     "balanced, quiet, workstation; or give a policy file's path)"]
    assert p.stdout == "" and list(tmp.iterdir()) == []


def test_a_broken_active_policy_stops_the_simulation_before_its_first_tick_and_leaves_nothing(tmp, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "mine.yaml").write_text("name: mine\n  rules: []\n")
    p = aithermd("run", "--simulate", "--policy-dir", str(policies), "--policy", "mine", "--duration", "10",
                 "--speedup", "0", "--log-format", "json", tmp=tmp)
    assert p.returncode == 78
    assert p.stderr.splitlines()[-1] == ("aithermd run --simulate: the daemon stopped with 78 before its first "
                                         "tick (see the error above); nothing was written")
    assert list(tmp.iterdir()) == []


def _raw(path: Path) -> int | None:
    """A knob file of the simulated tree; None when the kill caught a write halfway (a regular file is
    truncated, then written: it can be seen empty; a real sysfs store() is one call)."""
    try:
        return int(path.read_bytes())
    except ValueError:
        return None


def _limits(state: Path) -> list[float]:
    nvml = FakeNvml.open(state)
    return [nvml.power_limit_w(i) for i in range(len(nvml.gpus))]


@pytest.mark.parametrize("kill_when", ["relaxed", "raised"])
def test_kill_9_then_restore_puts_gpus_and_board_back(kill_when, tmp, tmp_path):
    original = Board.create(tmp_path / "pristine")
    board_before = original.knob_values()
    original.close()
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "aithermd", "run", "--simulate", "--state-dir", str(state),
                             "--speedup", "50", "--policy", "ai-training", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        want = {"relaxed": lambda lim: lim[0] == 360.0, "raised": lambda lim: lim[0] == 600.0}[kill_when]
        deadline = time.monotonic() + 60
        nvml_state = None
        while time.monotonic() < deadline:
            found = list(state.glob("sim-machine-*/nvml-state.json"))
            if found:
                nvml_state = found[0]
                try:
                    if want(_limits(nvml_state)):
                        break
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.05)
        else:
            pytest.fail(f"the simulated daemon never got {kill_when}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert (state / "journal.json").exists()  # it died holding knobs
    sysfs = nvml_state.parent / "sys"
    assert any(_raw(sysfs / k) != v for k, v in board_before.items())  # the board was changed

    p = subprocess.run([sys.executable, "-m", "aithermd", "restore", "--state-dir", str(state)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert {k: int((sysfs / k).read_bytes()) for k in board_before} == board_before
    assert _limits(nvml_state) == [450.0, 300.0]
    nvml = FakeNvml.open(nvml_state)
    assert all(nvml.fan_auto(i, f) for i in range(2) for f in range(nvml.fan_count(i)))
    assert not (state / "journal.json").exists()
