"""``aithermctl fans`` on the simulated workstation (issue 15): ``aithermctl fans calibrate --simulate``
runs aithermd's own detection and calibration; the demo's daemon command (``--calibrate-fans``, what
``aithermctl demo`` starts) comes up with what they found, and ``aithermctl fans`` shows it over D-Bus: which
pwm drives which fan input (CPU_OPT behind CPU_FAN's pwm2), the start and stop duty each fan showed, the
empty headers, the GPU fans beside the board's."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from aithermctl.demo import daemon_command
from tests.support.dbus import PrivateBus

pytestmark = pytest.mark.slow

NCT = "hwmon:nct6798-isa-0290"


def ctl(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aithermctl", *args], capture_output=True, text=True,
                          timeout=timeout)


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by their first column, cells split on runs of two spaces or more."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        if cells and cells[0].startswith(("hwmon:", "gpu")):
            out.setdefault(cells[0], cells[1:])
    return out


def test_aithermctl_fans_calibrate_runs_aithermds_detection_on_the_simulated_workstation(tmp_path):
    state = tmp_path / "state"
    out = ctl("fans", "calibrate", "--simulate", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout[out.stdout.index("pwm  "):])
    assert table[f"{NCT}/pwm2"][:3] == ["fan2, fan5", "25.3 %", "15.3 %"]  # one pwm, two fans
    assert table[f"{NCT}/pwm1"][:3] == ["fan1", "30.0 %", "20.0 %"]
    assert table[f"{NCT}/pwm5"][0] == table[f"{NCT}/pwm6"][0] == "(empty header)"
    stored = json.loads((state / "fans.json").read_text())
    assert stored["pwms"][f"{NCT}/pwm2"]["tachs"] == [f"{NCT}/fan2", f"{NCT}/fan5"]
    assert stored["idle"] == [f"{NCT}/fan6"]


def test_the_demos_daemon_shows_the_fans_it_calibrated(tmp_path):
    bus = PrivateBus.start("session")
    cmd = daemon_command(bus.address, str(tmp_path / "state"), None, None, "none")
    assert "--calibrate-fans" in cmd
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=(tmp_path / "daemon.log").open("wb"))
    try:
        deadline = time.monotonic() + 120
        out = ctl("--bus", bus.address, "fans")
        while out.returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            out = ctl("--bus", bus.address, "fans")
        assert out.returncode == 0, (out.stderr, (tmp_path / "daemon.log").read_text()[-2000:])
        table = rows(out.stdout)
        assert table[f"{NCT}/pwm2"][:3] == ["fan2, fan5", "25.3%", "15.3%"]  # as measured, not 25 %
        assert table[f"{NCT}/pwm5"][0] == "(empty header)"
        assert table["gpu0/fan0"][0] == "(the GPU's own)"  # GPU fans beside the board's
        assert "no fan detection stored" not in out.stdout
        assert f"! empty: {NCT}/pwm5: detection found no fan input following it" in out.stdout
        assert (tmp_path / "state" / "fans.json").exists()
    finally:
        daemon.terminate()
        daemon.wait(60)
        bus.stop()


def test_the_demos_daemon_runs_a_job_long_enough_for_the_search_and_its_cycle_parses():
    """The demo ran the daemon's default 6-minute job: balanced's search had barely moved when it ended.
    It now asks for a 30-minute one (6 minutes of wall time at its speed-up), which `aithermd run` takes."""
    from aithermd.cli import build_parser

    cmd = daemon_command("unix:path=/nonexistent", "/nonexistent/state", None, None, "none")
    assert cmd[cmd.index("--cycle") + 1] == "120,1800,120"
    args = build_parser("run").parse_args(cmd[cmd.index("run"):])
    assert args.sim_cycle == (120.0, 1800.0, 120.0) and args.sim_speedup == 5.0
    cmd = daemon_command("unix:path=/nonexistent", "/nonexistent/state", None, 20.0, "none", "1m,10m,1m")
    assert build_parser("run").parse_args(cmd[cmd.index("run"):]).sim_cycle == (60.0, 600.0, 60.0)
