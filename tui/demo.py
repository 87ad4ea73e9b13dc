"""``aithermctl demo``: a private D-Bus, aithermd on the simulated workstation, and the TUI on top.

Nothing touches the machine: the daemon runs with ``--simulate`` (simulated GPUs and board in a temporary
directory) after detecting and calibrating the simulated board's fans (``--calibrate-fans``, as ``aithermd
fans calibrate`` does: the TUI's fan table shows which pwm drives which fan and their start and stop
duty), its own temporary state directory, on a private ``dbus-daemon``; it serves Prometheus metrics on
``--metrics-listen`` (default 127.0.0.1:8736, as the daemon; ``none`` to serve none; a port already taken,
say by another demo or the real daemon, is said in one line and the demo runs on without metrics; the URL
is printed only once its own daemon listens there). A daemon that refuses the command line (``--cycle``,
``--policy``) is a usage error: its one line, exit 2. On exit
(quitting the TUI, Ctrl-C, SIGTERM, SIGHUP) the daemon is stopped, then the bus, then the directory is
removed; another signal meanwhile or after (a second Ctrl-C, a service manager's SIGTERM after SIGHUP) does
not cut that short, which takes at most 20 s (SIGKILL after that), and the exit status stays 130.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aithermd.publish import wire

DEFAULT_SPEEDUP = 5.0  # the default idle → training → idle cycle takes 2 minutes of wall time


DEFAULT_METRICS_LISTEN = "127.0.0.1:8736"  # the daemon's own default: point a Prometheus at the demo


# idle 2 min, then a 30-minute training job, then idle (simulated): at the default speed-up the job runs 6
# minutes of wall time, long enough to watch balanced's search step each GPU's limit down to its job's
# efficient one (the daemon's own default job, 6 minutes, ends before the search has moved much)
DEFAULT_CYCLE = "120,1800,120"


def banner(address: str, metrics: str, log: Path, speedup: float | None) -> str:
    """What ``demo --no-tui`` prints once the daemon answers: the address first (scripts read that line),
    then how to try it, the metrics URL line ``metrics`` (or ""), the log, and the simulated time's pace:
    timeouts, durations and energy windows run on it."""
    k = DEFAULT_SPEEDUP if speedup is None else speedup
    pace = f"{k:g}× wall time" if k else "as fast as it computes"
    return (f"simulated aithermd on {address}\n  try: aithermctl --bus '{address}' status\n"
            f"{metrics}  log: {log}\n  time: simulated, {pace} (hold and override timeouts, energy windows "
            "and explain count it)\n"
            "Ctrl-C stops it.")


def daemon_command(address: str, state_dir: str, policy: str | None, speedup: float | None,
                   metrics_listen: str = DEFAULT_METRICS_LISTEN, cycle: str = DEFAULT_CYCLE) -> list[str]:
    """The ``aithermd run --simulate`` command line (the ``aithermd`` script next to this Python, else
    ``python -m aithermd``); ``cycle`` is its ``--cycle`` (BEFORE,BUSY,AFTER)."""
    script = Path(sys.executable).with_name("aithermd")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "aithermd"]
    cmd += ["run", "--simulate", "--calibrate-fans", "--bus", address, "--metrics-listen", metrics_listen,
            "--state-dir", state_dir,
            "--speedup", f"{DEFAULT_SPEEDUP if speedup is None else speedup:g}", "--cycle", cycle]
    if policy:
        cmd += ["--policy", policy]
    return cmd


def start_bus(directory: str) -> tuple[subprocess.Popen[str], str]:
    """A private ``dbus-daemon`` listening in ``directory``; returns it and its address."""
    if shutil.which("dbus-daemon") is None:
        raise RuntimeError("dbus-daemon is not installed (apt install dbus-daemon)")
    bus = subprocess.Popen(["dbus-daemon", "--session", f"--address=unix:path={directory}/bus",
                            "--print-address", "--nofork", "--nopidfile"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert bus.stdout is not None
    try:
        address = bus.stdout.readline().strip()
    except BaseException:  # a stop (KeyboardInterrupt) before the caller holds the bus: not left behind
        bus.kill()
        bus.wait()
        raise
    if not address:
        bus.kill()
        raise RuntimeError("dbus-daemon did not start")
    return bus, address


async def wait_for_daemon(address: str, daemon: subprocess.Popen[bytes], timeout_s: float = 30.0) -> bool:
    """True once the daemon owns its bus name; False when it exits first or ``timeout_s`` passes."""
    from aithermctl.client import DaemonClient
    from aithermctl.errors import ClientError

    client = DaemonClient(address, timeout_s=5.0)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and daemon.poll() is None:
            with contextlib.suppress(ClientError):
                if await client.name_has_owner(wire.BUS_NAME):
                    return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await client.close()


def serves_metrics(pid: int, listen: str, log: Path, timeout_s: float = 10.0) -> bool:
    """Whether the daemon ``pid`` listens on ``listen``'s port: True once it does, False once its ``log``
    says ``metrics_unavailable`` (another process took the port first: two demos started together), it
    is gone, or ``timeout_s`` passes."""
    import psutil

    port = int(listen.rpartition(":")[2])  # checked by metrics_unavailable first
    if port == 0:  # the daemon picks one: nothing to check it against
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            proc = psutil.Process(pid)
            listening = (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")  # psutil < 6
        except psutil.Error:
            return False
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in listening):
            return True
        with contextlib.suppress(OSError):
            if "metrics_unavailable" in log.read_text(errors="replace"):
                return False
        time.sleep(0.05)
    return False


def _usage_error(log: Path) -> str | None:
    """The last line of a daemon that refused its command line (exit 2: argparse's ``aithermd run: error:
    ...`` after its usage, or ``aithermd run: --policy ...: ...``) without its prefixes, else None."""
    lines = [line for line in _tail(log, 5).splitlines() if line.strip()]
    if not lines:
        return None
    return lines[-1].removeprefix("aithermd run: ").removeprefix("error: ")


def stop(proc: subprocess.Popen | None, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def metrics_unavailable(listen: str) -> str | None:
    """Why the daemon could not serve ``/metrics`` on ``listen`` (``HOST:PORT``) now, or None when it can (or
    ``listen`` is ``none`` or port 0). Binds the address as the exporter would (``SO_REUSEADDR``, as
    ``http.server`` does) and lets it go at once."""
    if listen.strip().lower() in ("none", ""):
        return None
    host, sep, port = listen.rpartition(":")  # as the daemon reads it: HOST:PORT, [::1]:PORT
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"{listen!r} is not HOST:PORT"
    address = (host.strip("[]") or "127.0.0.1", int(port))
    if address[1] == 0:
        return None
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"{listen} is not free ({exc.strerror}; another aithermd or demo?)"
    return None


def run_demo(args: argparse.Namespace) -> int:
    spawning: list[int] = []  # while the daemon is being started: the signals that came meanwhile
    stopping: list[int] = []  # the signal that stopped the demo: those after it change nothing

    def on_term(signum: int, frame: object) -> None:
        if spawning:  # raised inside Popen after the fork, the daemon would run on, held by nobody
            spawning.append(signum)
            return
        if stopping:  # a second one raised in the except clause, before the finally ignores signals, escaped
            return  # as an uncaught KeyboardInterrupt: the demo died by SIGINT (-2) with its clean-up half done
        stopping.append(signum)
        raise KeyboardInterrupt

    # SIGHUP too: a closed terminal must not orphan the daemon and the bus (they run in their own sessions)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_term)
    tmp = tempfile.mkdtemp(prefix="aithermctl-demo-")
    log = Path(tmp, "aithermd.log")
    bus = daemon = None
    try:
        try:
            bus, address = start_bus(tmp)
        except RuntimeError as exc:
            print(f"aithermctl: demo: {exc}", file=sys.stderr)
            return wire.EXIT_FAILURE
        metrics_listen = getattr(args, "metrics_listen", DEFAULT_METRICS_LISTEN)
        if (why := metrics_unavailable(metrics_listen)) is not None:
            print(f"aithermctl: demo: metrics: {why}: this demo serves none (--metrics-listen HOST:PORT "
                  "picks another)", file=sys.stderr, flush=True)
            metrics_listen = "none"
        spawning.append(0)
        try:
            with log.open("wb") as sink:
                daemon = subprocess.Popen(daemon_command(address, str(Path(tmp, "state")), args.policy,
                                                         args.speedup, metrics_listen,
                                                         getattr(args, "cycle", None) or DEFAULT_CYCLE),
                                          stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                          start_new_session=True)
        finally:
            came = spawning[1:]
            spawning.clear()
        if came:  # now that it is held, it is stopped in the clean-up below
            stopping.append(came[0])
            raise KeyboardInterrupt
        up = asyncio.run(wait_for_daemon(address, daemon))
        if stopping:  # a stop raised inside the loop can be swallowed there (an import under way in a
            raise KeyboardInterrupt  # library's callback): the demo then ran on and a second SIGTERM was ignored
        if not up:
            if daemon.poll() == wire.EXIT_USAGE and (why := _usage_error(log)) is not None:
                print(f"aithermctl: demo: {why}", file=sys.stderr)  # --cycle 2m, --policy nosuch
                return wire.EXIT_USAGE
            print(f"aithermctl: demo: the simulated aithermd did not come up; its log:\n{_tail(log)}",
                  file=sys.stderr)
            return wire.EXIT_FAILURE
        if args.no_tui:
            served = metrics_listen.strip().lower() != "none"
            if served and not serves_metrics(daemon.pid, metrics_listen, log):
                print(f"aithermctl: demo: metrics: the daemon could not have {metrics_listen} (taken meanwhile, "
                      "another demo?): this demo serves none", file=sys.stderr, flush=True)
                served = False
            metrics = f"  metrics: http://{metrics_listen}/metrics\n" if served else ""
            print(banner(address, metrics, log, args.speedup), flush=True)
            while daemon.poll() is None:
                if stopping:  # a stop that was swallowed where it was raised
                    raise KeyboardInterrupt
                time.sleep(0.5)
            print(f"aithermctl: demo: aithermd exited ({daemon.returncode}); its log:\n{_tail(log)}",
                  file=sys.stderr)
            return wire.EXIT_FAILURE
        if stopping:
            raise KeyboardInterrupt
        from aithermctl.tui_main import run_tui
        return run_tui(address)
    except KeyboardInterrupt:
        return 130
    finally:
        # the clean-up runs to its end, and the demo is the process's last act: a signal after it (a second
        # SIGTERM while the interpreter exits) is ignored too, so the exit status says how the demo ended
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        stop(daemon)
        stop(bus, 5.0)
        shutil.rmtree(tmp, ignore_errors=True)
