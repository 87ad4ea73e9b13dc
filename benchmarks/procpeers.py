"""The processes ``bench_process.py`` runs side by side, and how it reads them from outside.

A :class:`Peer` is one process on its own copy of a scenario's tree: ``after`` (the daemon of this checkout),
``before`` (the daemon of ``--before DIR``, the same command with that checkout first on ``PYTHONPATH``),
``lean`` (``lean_loop.py``) or ``fan2go`` (a binary given with ``--fan2go``, configured with file sensors and
fans on the same tree). Figures come from ``/proc/PID/stat`` (utime + stime, every thread) and
``/proc/PID/status`` (VmRSS); readiness from ``READY=1`` on a ``NOTIFY_SOCKET`` of the benchmark's own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def prepare(args: Any, work: Path) -> None:
    """The policy directory every daemon loads, and for ``--before`` a ``PYTHONPATH`` directory holding that
    checkout's ``aithermd`` and its ``tui`` as ``aithermctl`` (as the wheel installs it). Both checkouts are
    byte-compiled first."""
    for tree in (HERE.parent, args.before):  # as an installed package is, so that no peer compiles its
        if tree is not None:  # modules at each start (PYTHONDONTWRITEBYTECODE, a fresh checkout)
            dirs = [str(tree / d) for d in ("aithermd", "tui", "benchmarks")]
            subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], stdout=subprocess.DEVNULL,
                           check=False)
    policies = work / "policies"
    policies.mkdir()
    (policies / "reference.yaml").write_text((HERE / "reference-policy.yaml").read_text())
    args.before_path = None
    if args.before:
        path = work / "before-path"
        path.mkdir()
        (path / "aithermd").symlink_to(args.before.resolve() / "aithermd")
        (path / "aithermctl").symlink_to(args.before.resolve() / "tui")
        args.before_path = str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and of the children it has waited for (cutime + cstime, proc(5)): a daemon
    that parses its policies in a short-lived child pays for it here, as systemd's CPUAccounting counts it."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def proc_sched_s(pid: int) -> float:
    """CPU time of every live thread of ``pid``, s, to the nanosecond (``/proc/PID/task/*/schedstat``, first
    field). utime + stime are sampled at the scheduler tick (10 ms here), too coarse for a few ms a
    second; a thread that ended inside a window loses its time here (none of the peers ends threads
    between ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _env(kind: str, args: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOTIFY_SOCKET", "WATCHDOG_USEC")}
    if kind == "before":
        env["PYTHONPATH"] = args.before_path
    return env


class Peer:
    """One process of a scenario; ``marks``: (monotonic s, CPU s (threads' schedstat), RSS MB, utime+stime s)
    at each window edge; ``scrapes``:
    wall s of each ``/metrics`` GET."""

    def __init__(self, kind: str, scenario: str, tree: Path, gpus: int, policy_dir: Path, args: Any,
                 bus: str | None = None) -> None:
        self.kind, self.scenario, self.tree, self.gpus = kind, scenario, tree, gpus
        self.policy_dir, self.args, self.bus = policy_dir, args, bus
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.marks: list[tuple[float, float, float, float]] = []
        self.scrapes: list[float] = []
        self.body = b""  # the last /metrics answer
        self._notify: socket.socket | None = None
        self._started = 0.0

    def command(self) -> list[str]:
        sysfs = str(self.tree / "sys")
        if self.kind in ("after", "before"):
            daemon = ["run", "--sysfs-root", sysfs, "--state-dir", str(self.tree / "state"),
                      "--bus", self.bus or "none", "--metrics-listen", f"127.0.0.1:{self.port}",
                      "--policy-dir", str(self.policy_dir), "--policy", "reference"]
            if self.gpus:
                return [sys.executable, str(HERE / "run_daemon.py"), "--gpus", str(self.gpus), "--", *daemon]
            return [sys.executable, "-m", "aithermd", *daemon]
        if self.kind == "lean":
            return [sys.executable, str(HERE / "lean_loop.py"), "--sysfs-root", sysfs,
                    "--policy", str(self.policy_dir / "reference.yaml"),
                    "--listen", f"127.0.0.1:{self.port}", "--gpus", str(self.gpus)]
        return [str(self.args.fan2go), "-c", str(self._fan2go_config()), "--no-style"]

    def start(self) -> None:
        self.tree.mkdir(parents=True, exist_ok=True)
        env = _env(self.kind, self.args)
        path = str(self.tree / "notify")
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(path)
        env["NOTIFY_SOCKET"] = path
        log = open(self.tree / "log", "wb")  # noqa: SIM115 - closed when the process ends
        self._started = time.monotonic()
        self.proc = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, cwd=self.tree)
        log.close()

    def wait_ready(self, timeout_s: float) -> tuple[float, float]:
        """Wait for READY=1 (fan2go: for its metrics port); returns (CPU s, wall s) at that moment."""
        assert self.proc is not None and self._notify is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.kind} ({self.scenario}) exited {self.proc.returncode}:\n"
                                 + (self.tree / "log").read_text()[-3000:])
            if self.kind == "fan2go":
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                    break
                time.sleep(0.1)
                continue
            self._notify.settimeout(0.2)
            try:
                if b"READY=1" in self._notify.recv(4096).split(b"\n"):
                    break
            except TimeoutError:
                continue
        else:
            raise SystemExit(f"{self.kind} ({self.scenario}) not ready within {timeout_s:g} s:\n"
                             + (self.tree / "log").read_text()[-3000:])
        return proc_cpu_s(self.proc.pid), time.monotonic() - self._started

    def mark(self, now: float) -> None:
        assert self.proc is not None
        pid = self.proc.pid
        self.marks.append((now, proc_sched_s(pid), proc_rss_mb(pid), proc_cpu_s(pid)))

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise SystemExit(f"{self.kind} ({self.scenario}) died ({self.proc.returncode}):\n"
                             + (self.tree / "log").read_text()[-3000:])

    def scrape(self) -> None:
        """One ``GET /metrics`` as Prometheus 2.x sends it, on a new connection; wall time kept."""
        request = (f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nUser-Agent: Prometheus/2.42.0\r\n"
                   "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                   "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n"
                   "Connection: close\r\n\r\n").encode()
        t0 = time.perf_counter()
        body = b""
        with socket.create_connection(("127.0.0.1", self.port), 5.0) as s:
            s.sendall(request)
            while chunk := s.recv(1 << 16):
                body += chunk
        self.scrapes.append(time.perf_counter() - t0)
        self.body = body
        if b" 200 " not in body.split(b"\r\n", 1)[0]:
            raise SystemExit(f"{self.kind} ({self.scenario}) /metrics: {body[:200]!r}")
        time.sleep(0.003)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._notify is not None:
            self._notify.close()
            self._notify = None

    def _fan2go_config(self) -> Path:
        """fan2go on the same tree: file sensors, file fans (pwm and rpm files), the reference curves, 1 s
        rates, its Prometheus exporter on the peer's port."""
        chip = self.tree / "sys" / "class" / "hwmon" / "hwmon0"
        names = ["Tctl", "Tccd1", "SYSTIN", "AUXTIN0", "AUXTIN1", "PCH_CHIP_TEMP"]
        lines = [f"dbPath: {self.tree / 'fan2go.db'}", "tempSensorPollingRate: 1s", "rpmPollingRate: 1s",
                 "controllerAdjustmentTickRate: 1s", "sensors:"]
        for i, name in enumerate(names, start=1):
            lines += [f"  - id: {name}", "    file:", f"      path: {chip / f'temp{i}_input'}"]
        lines += ["curves:",
                  "  - id: cpu", "    linear:", "      sensor: Tctl",
                  "      steps: [{40: 77}, {60: 115}, {75: 191}, {85: 255}]",
                  "  - id: case", "    pid:", "      sensor: SYSTIN", "      setPoint: 45",
                  "      p: -0.05", "      i: -0.005", "      d: -0.005",
                  "  - id: both", "    function:", "      type: maximum", "      curves: [cpu, case]",
                  "fans:"]
        for n, curve in ((1, "cpu"), (2, "both"), (3, "both")):
            lines += [f"  - id: fan{n}", "    file:", f"      path: {chip / f'pwm{n}'}",
                      f"      rpmPath: {chip / f'fan{n}_input'}", f"    curve: {curve}", "    neverStop: true",
                      "    minPwm: 30", "    startPwm: 30", "    maxPwm: 255"]
        lines += ["statistics:", "  enabled: true", f"  port: {self.port}", "api:", "  enabled: false"]
        path = self.tree / "fan2go.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path


@contextlib.contextmanager
def private_bus(where: Path) -> Iterator[str]:
    """A private ``dbus-daemon`` (session configuration); yields its address."""
    where.mkdir(parents=True, exist_ok=True)
    bus = subprocess.Popen(["dbus-daemon", "--session", f"--address=unix:path={where}/bus", "--print-address",
                            "--nofork", "--nopidfile"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    try:
        assert bus.stdout is not None
        yield bus.stdout.readline().strip()
    finally:
        bus.terminate()
        bus.wait()


def timed_ctl(kind: str, args: Any, argv: list[str], runs: int) -> float:
    """Median wall ms of ``aithermctl ARGV`` as a fresh process (what the console script runs)."""
    cmd = [sys.executable, "-c", "import sys; from aithermctl.cli import main; sys.exit(main())", *argv]
    env = _env(kind, args)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"aithermctl {' '.join(argv)} ({kind}) failed {proc.returncode}: "
                             f"{proc.stderr.decode()[-2000:]}")
    return statistics.median(times) * 1000.0
