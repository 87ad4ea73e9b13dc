"""aithermctl against the real daemon: `aithermd run --simulate` on a private bus (one daemon for the
module), the CLI as a process. Run as root, so polkit always allows (refusals are tested against the
scripted daemon in test_cli_fake_bus.py and against polkitd in tests/publish/dbus)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from aithermd.publish import wire
from tests.support.dbus import PrivateBus

pytestmark = pytest.mark.slow


def ctl(bus: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aithermctl", "--bus", bus, *args], capture_output=True,
                          text=True, timeout=timeout)


def until(predicate, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def holds(bus: str) -> list[dict]:
    return json.loads(ctl(bus, "status", "--json").stdout)["policy"]["holds"]


def holds_become(bus: str, count: int) -> list[dict]:
    """The holds, once there are ``count`` (changes take effect at the next tick)."""
    found: list[dict] = []

    def check() -> bool:
        found[:] = holds(bus)
        return len(found) == count

    until(check)
    return found


@pytest.fixture(scope="module")
def sim_bus(tmp_path_factory) -> Iterator[str]:
    bus = PrivateBus.start("session")
    tmp = tmp_path_factory.mktemp("sim")
    address = bus.address
    daemon = subprocess.Popen([sys.executable, "-m", "aithermd", "run", "--simulate", "--bus", address,
                               "--metrics-listen", "none", "--state-dir", str(tmp / "state"), "--tick", "0.2",
                               "--log-format", "json"],
                              stdout=subprocess.DEVNULL, stderr=(tmp / "daemon.log").open("wb"))
    try:
        until(lambda: ctl(address, "status", "--json").returncode == 0, 60)
        until(lambda: json.loads(ctl(address, "status", "--json").stdout)["seq"] >= 2)
        yield address
    finally:
        daemon.terminate()
        daemon.wait(30)
        bus.stop()


def test_status_json_is_the_snapshot_of_the_simulated_workstation(sim_bus):
    p = ctl(sim_bus, "status", "--json")
    assert p.returncode == 0 and p.stderr == ""
    doc = wire.check(json.loads(p.stdout), wire.SnapshotDoc, strict=True)  # the shape aithermctl reads
    assert p.stdout.count("\n") == 1  # exactly one document
    ids = {d["id"] for d in doc["devices"]}
    assert {"gpu0", "gpu1", "hwmon:nct6798-isa-0290", "powercap:package-0"} <= ids
    gpu0 = next(d for d in doc["devices"] if d["id"] == "gpu0")
    assert {"gpu0/temperature", "gpu0/power", "gpu0/utilization"} <= {c["id"] for c in gpu0["channels"]}
    temperature = next(c for c in gpu0["channels"] if c["attribute"] == "temperature")
    assert set(temperature["thresholds"]) == {"slowdown", "shutdown", "max_operating"}  # the slowdown line
    knob = next(k for k in gpu0["knobs"] if k["id"] == "gpu0/power_limit")
    assert knob["unit"] == "W" and {"requested", "reason"} <= set(knob)
    assert set(doc["policy"]) >= {"active", "holds", "states"}


def test_status_text(sim_bus):
    p = ctl(sim_bus, "status")
    assert p.returncode == 0
    assert "gpu0  NVIDIA GeForce RTX 4090" in p.stdout and "gpu1  NVIDIA RTX 6000 Ada Generation" in p.stdout
    assert "CPU packages" in p.stdout and "package-0" in p.stdout
    assert "nct6798-isa-0290 fan1" in p.stdout


def test_policy_list_show_set(sim_bus):
    p = ctl(sim_bus, "policy", "list")
    names = [line[2:].split()[0] for line in p.stdout.splitlines()]
    assert {"balanced", "ai-training", "quiet"} <= set(names)
    assert "* balanced" in p.stdout
    assert "rules:" in ctl(sim_bus, "policy", "show", "quiet").stdout
    try:
        assert ctl(sim_bus, "policy", "set", "quiet").returncode == 0
        until(lambda: json.loads(ctl(sim_bus, "status", "--json").stdout)["policy"]["active"] == "quiet")
        assert "* quiet" in ctl(sim_bus, "policy", "list").stdout
    finally:
        ctl(sim_bus, "policy", "set", "balanced")
    p = ctl(sim_bus, "policy", "set", "turbo")
    assert p.returncode == wire.EXIT_USAGE and "policies: aithermctl policy list" in p.stderr


def test_hold_detached_and_release(sim_bus):
    p = ctl(sim_bus, "hold", "ai-training", "--reason", "epoch", "--timeout", "10m", "--detach")
    cookie = int(p.stdout)
    (hold,) = holds_become(sim_bus, 1)
    assert (hold["cookie"], hold["policy"], hold["reason"]) == (cookie, "ai-training", "epoch")
    assert hold["detached"] is True
    assert ctl(sim_bus, "release", str(cookie)).returncode == 0
    holds_become(sim_bus, 0)
    assert ctl(sim_bus, "release", str(cookie)).returncode == wire.EXIT_USAGE


def test_a_hold_with_a_timeout_returns_when_the_daemon_ends_it(sim_bus):
    """newuser8 #1: `hold --timeout 5s` without --detach went on "holding" after the daemon had ended the
    hold. The real daemon's end (its Event and its Holds) ends aithermctl, with 0 and in words."""
    p = ctl(sim_bus, "hold", "quiet", "--reason", "short", "--timeout", "2s", timeout=60)
    assert p.returncode == 0, p.stderr
    cookie = int(p.stdout)
    assert f"hold {cookie} on quiet expired after 2.0s (--timeout); the daemon ended it" in p.stderr
    assert "releasing hold" not in p.stderr
    holds_become(sim_bus, 0)


def test_run_passes_the_exit_code_and_releases(sim_bus):
    p = ctl(sim_bus, "run", "--policy", "ai-training", "--", sys.executable, "-c",
            "import sys; print('running'); sys.exit(5)")
    assert p.returncode == 5 and p.stdout == "running\n"
    holds_become(sim_bus, 0)


def test_run_releases_its_hold_when_the_child_is_killed(sim_bus):
    proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "--bus", sim_bus, "run", "--policy",
                             "ai-training", "--", "sh", "-c", "echo $$; exec sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    (hold,) = holds_become(sim_bus, 1)
    assert hold["policy"] == "ai-training" and hold["detached"] is False
    os.kill(child, signal.SIGKILL)
    assert proc.wait(30) == 128 + signal.SIGKILL
    holds_become(sim_bus, 0)


def test_a_killed_aithermctl_run_leaves_no_hold(sim_bus):
    proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "--bus", sim_bus, "run", "--policy",
                             "quiet", "--", "sh", "-c", "echo $$; exec sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    try:
        holds_become(sim_bus, 1)
        proc.kill()  # its bus connection closes: the daemon ends the non-detached hold
        proc.wait(30)
        holds_become(sim_bus, 0)
    finally:
        os.kill(child, signal.SIGKILL)


def test_override_explain_clear(sim_bus):
    p = ctl(sim_bus, "override", "gpu0/power_limit", "300W", "--for", "10m")
    assert p.returncode == 0, p.stderr
    try:
        def overridden():
            doc = json.loads(ctl(sim_bus, "status", "--json").stdout)
            knob = next(k for d in doc["devices"] for k in d["knobs"] if k["id"] == "gpu0/power_limit")
            return knob["layer"] == "override" and knob["value"] == 300.0
        until(overridden)
        text = " ".join(ctl(sim_bus, "explain", "gpu0/power_limit").stdout.split())
        assert text.startswith("gpu0/power_limit is 300 W, set by an operator override")
    finally:
        assert ctl(sim_bus, "override", "clear", "gpu0/power_limit").returncode == 0
    p = ctl(sim_bus, "override", "gpu0/power_limit", "5000")
    assert p.returncode == wire.EXIT_USAGE and p.stderr.count("\n") == 1 and "gpu0/power_limit" in p.stderr
    p = ctl(sim_bus, "override", "gpu9/power_limit", "100")
    assert p.returncode == wire.EXIT_USAGE


def test_a_fan_overridden_to_stop_with_no_end_is_warned_about_and_not_for_a_while(sim_bus):
    p = ctl(sim_bus, "override", "hwmon:nct6798-isa-0290/pwm3", "0")
    try:
        assert p.returncode == 0, p.stderr
        assert p.stderr.splitlines() == [
            "aithermctl: hwmon:nct6798-isa-0290/pwm3 overridden to 0% until cleared",
            "aithermctl: warning: hwmon:nct6798-isa-0290/pwm3 at 0 % with no end: its fan stays stopped until "
            "`aithermctl override clear hwmon:nct6798-isa-0290/pwm3` (a critical temperature or a failed sensor "
            "still drives it to full)"]
    finally:
        assert ctl(sim_bus, "override", "clear", "hwmon:nct6798-isa-0290/pwm3").returncode == 0
    p = ctl(sim_bus, "override", "hwmon:nct6798-isa-0290/pwm3", "0", "--for", "30s")
    try:
        assert p.returncode == 0 and "warning" not in p.stderr
    finally:
        assert ctl(sim_bus, "override", "clear", "hwmon:nct6798-isa-0290/pwm3").returncode == 0


def test_explain_all_gives_a_paragraph_per_knob(sim_bus):
    p = ctl(sim_bus, "explain")
    explained = json.loads(ctl(sim_bus, "explain", "--json").stdout)
    doc = json.loads(ctl(sim_bus, "status", "--json").stdout)
    knobs = [k["id"] for d in doc["devices"] for k in d["knobs"]]
    paragraphs = p.stdout.strip().split("\n\n")
    assert p.returncode == 0 and [par.split()[0] for par in paragraphs] == knobs
    assert set(explained) <= set(knobs)
    one = ctl(sim_bus, "explain", "gpu1/fan0")  # a knob no rule touches: the daemon explains nothing
    assert one.returncode == 0 and one.stdout.startswith("gpu1/fan0 is ")


def test_energy_measures_joules_per_gpu_and_zone(sim_bus):
    p = ctl(sim_bus, "energy", "--json", "--", "sleep", "1.5")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["duration_s"] > 1.0
    assert result["joules"]["gpu0"] > 0 and result["joules"]["gpu1"] > 0
    assert "powercap:package-0" in result["joules"]
    p = ctl(sim_bus, "energy", "--", "sh", "-c", "sleep 1; exit 4")
    assert p.returncode == 4
    assert p.stderr.splitlines()[0].startswith("energy while sh -c 'sleep 1; exit 4' ran")
    assert any(line.split()[0] == "gpu0" and line.endswith("W mean") for line in p.stderr.splitlines()[1:])


def test_energy_past_its_timeout_reports_what_was_measured_and_the_commands_status(sim_bus):
    """It printed 'no open energy window … (the window ended or timed out)' and exited 2 after CMD ran."""
    p = ctl(sim_bus, "energy", "--timeout", "1s", "--", "sh", "-c", "sleep 2.5; exit 3")
    assert p.returncode == 3, p.stderr
    lines = p.stderr.splitlines()
    assert lines[0] == ("aithermctl energy: warning: the energy window timed out after 1 s (--timeout) while "
                        "the command ran on; what was measured up to then:")
    assert lines[1] == ("energy in the first 1.0s (1.000 s) of sh -c 'sleep 2.5; exit 3', when the window "
                        "timed out:")
    assert any(line.split()[0] == "gpu0" and line.endswith("W mean") for line in lines[2:])
    p = ctl(sim_bus, "energy", "--json", "--timeout", "1s", "--", "sleep", "2")
    assert p.returncode == 0 and json.loads(p.stdout)["timed_out"] is True


def test_doctor_sees_the_daemon(sim_bus):
    p = ctl(sim_bus, "doctor")
    assert "ok    bus" in p.stdout
    line = next(line for line in p.stdout.splitlines() if line.split()[1] == "daemon")
    assert line.startswith("ok") and "policy balanced" in line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal was closed
def test_demo_starts_and_cleans_up(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "demo", "--no-tui"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("simulated aithermd on unix:path=")
        address = first.split(" on ", 1)[1].strip()
        directory = address.split("unix:path=", 1)[1].split(",")[0].rsplit("/", 1)[0]
        assert os.path.isdir(directory)
        assert ctl(address, "status").returncode == 0
    finally:
        proc.send_signal(sig)
        rc = proc.wait(60)
    assert rc == 130
    assert not os.path.exists(directory)
    assert ctl(address, "status").returncode == wire.EXIT_NOT_RUNNING  # the bus is gone too


@pytest.mark.parametrize("when", ["running", "starting"])
def test_a_second_sigterm_while_the_demo_stops_still_stops_its_bus_and_daemon(when):
    """A SIGTERM while the demo stopped its daemon (a service manager after SIGHUP, a second Ctrl-C) cut the
    clean-up short: the private dbus-daemon ran on, its directory stayed."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "demo", "--no-tui", "--metrics-listen",
                             "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(proc.pid)
    try:
        if when == "running":
            assert proc.stdout.readline().startswith("simulated aithermd on unix:path=")
        deadline = time.monotonic() + 60
        while not any(c.name() == "dbus-daemon" for c in me.children()):  # the bus is up
            assert time.monotonic() < deadline
            time.sleep(0.05)
        children = me.children()
        (bus,) = [c for c in children if c.name() == "dbus-daemon"]
        directory = bus.cmdline()[2].split("unix:path=", 1)[1].rsplit("/", 1)[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # it is stopping the daemon now
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 130
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert alive == [] and bus in gone
    assert not os.path.exists(directory)


def _start_daemon(address: str, state_dir: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aithermd", "run", "--simulate", "--bus", address,
                             "--metrics-listen", "none", "--state-dir", state_dir, "--tick", "0.2",
                             "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=log)


async def _pilot_until(pilot, predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the TUI did not get there in time"
        await pilot.pause(0.1)


async def test_tui_follows_the_simulated_daemon_and_reconnects_after_a_restart(private_bus, tmp_path):
    from screen_text import screen_text

    from aithermctl.app import AithermApp
    from aithermctl.client import DaemonClient
    from aithermctl.widgets.gpu_card import GpuCard

    log = (tmp_path / "daemon.log").open("wb")
    daemon = _start_daemon(private_bus, str(tmp_path / "state"), log)
    app = AithermApp(DaemonClient(private_bus), retry_s=(0.2, 0.5), poll_s=2.0)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await _pilot_until(pilot, lambda: len(app.screen.query(GpuCard)) == 2)
            await _pilot_until(pilot, lambda: "gpu1 · NVIDIA RTX 6000 Ada Generation" in screen_text(app))
            text = screen_text(app)
            assert "gpu0 · NVIDIA GeForce RTX 4090" in text and "CPU packages" in text
            assert screen_text(app).startswith(" ● policy balanced")
            seq = app.state.doc["seq"]
            await _pilot_until(pilot, lambda: app.state.doc["seq"] > seq)  # it follows the ticks

            daemon.terminate()
            daemon.wait(30)
            await _pilot_until(pilot, lambda: app.state.connected is False)
            assert "○ aithermd is not running on the bus at" in screen_text(app)

            daemon = _start_daemon(private_bus, str(tmp_path / "state"), log)
            await _pilot_until(pilot, lambda: app.state.connected is True)
            await _pilot_until(pilot, lambda: screen_text(app).startswith(" ● policy balanced"))
            assert any(e.get("message") == "reconnected to aithermd" for _, e in app.state.events)
    finally:
        daemon.terminate()
        daemon.wait(30)


def test_demo_serves_metrics_with_real_tick_durations_and_process_metrics():
    """`aithermctl demo` serves the simulated daemon's metrics; the tick histogram holds real durations
    (measured in real time, not on the simulated clock, where every tick took 0 s), and process_* are
    there as from any Prometheus client."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "demo", "--no-tui", "--speedup", "20",
                             "--metrics-listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert f"  metrics: http://127.0.0.1:{port}/metrics\n" in lines
        deadline = time.monotonic() + 60
        while True:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            except OSError:  # the exporter starts just after the bus name is owned
                text = ""
            values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line and not line.startswith("#")}
            if values.get("aithermd_tick_duration_seconds_count", 0) >= 5:
                break
            assert time.monotonic() < deadline, "no ticks counted"
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert values["aithermd_tick_duration_seconds_sum"] > 0
    assert values["aithermd_tick_duration_seconds_bucket{le=\"0.0005\"}"] < values[
        "aithermd_tick_duration_seconds_count"]  # not every tick in the lowest bucket (0 s)
    assert values["process_resident_memory_bytes"] > 10e6 and values["process_cpu_seconds_total"] > 0


def test_a_second_demo_on_a_taken_metrics_port_says_so_and_prints_no_metrics_url():
    """A second `aithermctl demo` printed the default metrics URL, which the first demo served: a scrape
    there read the other daemon. Now the taken port is said in one line and no URL is printed."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "aithermctl", "demo", "--no-tui", "--metrics-listen",
                                 f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout.readline().startswith("simulated aithermd on unix:path=")
            lines = [proc.stdout.readline()]
            while lines[-1] not in ("Ctrl-C stops it.\n", "") and len(lines) < 8:
                lines.append(proc.stdout.readline())
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
    assert rc == 130
    assert not any("metrics:" in line for line in lines) and lines[-1] == "Ctrl-C stops it.\n"
    # the demo's time is simulated, at 5× (a `hold --timeout 2m` showed 1m 06s left after 10 s: newuser8)
    assert "  time: simulated, 5× wall time (hold and override timeouts, energy windows and explain count it)\n" \
        in lines
    assert proc.stderr.read().splitlines()[0] == (
        f"aithermctl: demo: metrics: 127.0.0.1:{port} is not free (Address already in use; another aithermd "
        "or demo?): this demo serves none (--metrics-listen HOST:PORT picks another)")


def test_policy_set_warns_about_a_rule_that_selects_nothing_here(tmp_path):
    """`aithermctl policy set` of a policy whose fan rule names a chip this machine lacks: set, and warned
    about in one line with FILE:LINE (it was accepted silently)."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "policies" / "quiet.yaml").read_text()
    policies = tmp_path / "policies"
    policies.mkdir()
    lab = text.replace('fans: {chip: ["nct*", "it87*", "f71*", "w83*"]}', 'fans: {chip: ["it8688e"]}')
    (policies / "lab.yaml").write_text(lab)
    line = next(n for n, s in enumerate(lab.splitlines(), 1) if "it8688e" in s)  # the rule's fans: line
    bus = PrivateBus.start("session")
    daemon = subprocess.Popen([sys.executable, "-m", "aithermd", "run", "--simulate", "--bus", bus.address,
                               "--metrics-listen", "none", "--state-dir", str(tmp_path / "state"),
                               "--policy-dir", str(policies), "--tick", "0.2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: ctl(bus.address, "status", "--json").returncode == 0, 60)
        p = ctl(bus.address, "policy", "set", "lab")
        assert p.returncode == 0, p.stderr
        lines = p.stderr.splitlines()
        assert lines[0] == "aithermctl: active policy is now lab"
        assert len(lines) == 2 and lines[1].startswith(f"aithermctl: warning: {policies / 'lab.yaml'}:{line}:")
        assert "selects no fan on this machine" in lines[1]
        p = ctl(bus.address, "policy", "set", "quiet")  # a policy that fits: no warning
        assert p.stderr.splitlines() == ["aithermctl: active policy is now quiet"]
    finally:
        daemon.terminate()
        daemon.wait(30)
        bus.stop()


def test_processes_and_the_energy_report_of_the_simulated_workstation(sim_bus):
    def desktop() -> dict | None:
        doc = json.loads(ctl(sim_bus, "status", "--json").stdout)
        gpu0 = ((doc.get("processes") or {}).get("gpus") or {}).get("gpu0") or {}
        return next((p for p in gpu0.get("processes") or () if p["comm"] == "gnome-shell"), None)

    shell = until(desktop, 60)  # the first accounting pass, 5 s after the start
    assert shell["user"] == "you" and shell["kinds"] == "G"
    assert shell["unit"] == "org.gnome.Shell@wayland.service"
    text = ctl(sim_bus, "status").stdout
    assert "Processes (pid, user" in text and "/usr/bin/gnome-shell" in text and "memory " in text
    report = until(lambda: json.loads(ctl(sim_bus, "energy", "report", "--by", "unit",
                                          "--json").stdout)["rows"])
    assert report[0]["name"] == "org.gnome.Shell@wayland.service" and report[0]["total_j"] > 0
    p = ctl(sim_bus, "energy", "report", "--by", "nonsense")
    assert p.returncode == wire.EXIT_USAGE and "invalid choice" in p.stderr


def test_two_demos_started_together_never_both_claim_the_metrics_port(tmp_path):
    """Both demos' checks passed before either daemon bound the port: both printed the URL, and one
    pointed at the other's daemon. Now each says the URL only once its own daemon listens there."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "aithermctl", "demo", "--no-tui", "--metrics-listen", f"127.0.0.1:{port}"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    try:
        for proc in procs:
            lines = [proc.stdout.readline()]
            while lines[-1] not in ("Ctrl-C stops it.\n", ""):
                lines.append(proc.stdout.readline())
            outs.append(lines)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        errs = [proc.communicate(timeout=60)[1] for proc in procs]
    claimed = [any(f"metrics: http://127.0.0.1:{port}/metrics" in line for line in out) for out in outs]
    assert claimed.count(True) == 1, (outs, errs)
    loser = claimed.index(False)
    assert "this demo serves none" in errs[loser]


@pytest.mark.parametrize(("args", "said"), [(["--cycle", "2m,22m"], "argument --cycle: '2m,22m'"),
                                            (["--policy", "nosuch"], "nosuch")])
def test_a_demo_whose_daemon_refuses_its_arguments_is_a_usage_error_in_one_line(args, said):
    """`demo --cycle 2m,22m` started the bus and daemon, then printed the daemon's whole usage text as
    'did not come up', exit 1. Now it is the daemon's one error line, exit 2."""
    p = subprocess.run([sys.executable, "-m", "aithermctl", "demo", "--no-tui", "--metrics-listen", "none",
                        *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == wire.EXIT_USAGE, p.stderr
    assert p.stderr.startswith("aithermctl: demo: ") and said in p.stderr and len(p.stderr.splitlines()) == 1
    assert p.stdout == ""
