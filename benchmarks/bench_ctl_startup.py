"""How fast ``aithermctl --help`` and ``aithermctl status`` start and finish (target: ≤ 250 ms each).

Runs each command N times as a fresh process (the installed console script) and prints median, p90 and max
wall time. ``status`` talks over a private ``dbus-daemon`` to the scripted daemon of ``tests/tui`` (the same
JSON document a real daemon sends), so the figure covers import, connect, GetSnapshot and rendering.
Also checks that the CLI verbs never import textual.

    .venv/bin/python benchmarks/bench_ctl_startup.py [--runs 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.250


def console_script() -> list[str]:
    script = Path(sys.executable).with_name("aithermctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "aithermctl"]


def timed(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode().strip()}")
    return out


def report(name: str, times: list[float]) -> bool:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    med = statistics.median(times)
    ok = med <= TARGET_S
    print(f"{name:<28} median {med * 1000:6.1f} ms   p90 {p90 * 1000:6.1f} ms   "
          f"max {times[-1] * 1000:6.1f} ms"
          f"   {'ok' if ok else 'OVER'} (target {TARGET_S * 1000:.0f} ms)")
    return ok


def no_textual() -> bool:
    code = ("import sys, aithermctl.cli, aithermctl.verbs, aithermctl.client, aithermctl.render, "
            "aithermctl.doctor; print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    print(f"textual modules imported by the CLI verbs: {loaded.strip()}")
    return loaded.strip() == "[]"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    cmd = console_script()
    ok = no_textual()
    ok &= report("aithermctl --help", timed([*cmd, "--help"], runs))
    if shutil.which("dbus-daemon") is None:
        print("dbus-daemon missing: status not measured")
        return 0 if ok else 1
    with tempfile.TemporaryDirectory() as tmp:
        bus = subprocess.Popen(["dbus-daemon", "--session", f"--address=unix:path={tmp}/bus",
                                "--print-address", "--nofork", "--nopidfile"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        address = bus.stdout.readline().strip()
        daemon = subprocess.Popen([sys.executable, str(ROOT / "tests" / "tui" / "fake_daemon.py"), address],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert daemon.stdout.readline().strip() == "ready"
            ok &= report("aithermctl status", timed([*cmd, "--bus", address, "status"], runs))
            json_cmd = [*cmd, "--bus", address, "status", "--json"]
            ok &= report("aithermctl status --json", timed(json_cmd, runs))
        finally:
            daemon.terminate()
            daemon.wait()
            bus.terminate()
            bus.wait()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
