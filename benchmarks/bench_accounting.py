"""In-process breakdown: what energy attribution costs the daemon, on this machine's real processes.

Two costs, beside the reference each is bounded by:

- per snapshot (every tick): :meth:`EnergyService.on_publish` on the reference workstation's snapshot (two
  GPUs, RAPL zones): the meter's pass over the energy channels, the windows, the pending joules;
- per accounting pass (every ``energy_interval_s``, 5 s by default, off the event loop): the process scan
  (psutil ``process_iter(["cpu_times"])``, what :class:`ProcessTable` does) beside a bare loop reading every
  ``/proc/PID/stat`` (the least any scan can do), per process; and the first scan, which also reads each
  process's identity (status, comm, cmdline, cgroup).

CPU is ``time.process_time`` (all threads) over repeated runs; the best of five is reported. Targets: ≤ 40 µs
per snapshot; a later scan ≤ 100 µs per process (about 10× the bare loop: psutil's process objects), so a
workstation with 500 processes spends ≤ 1 % of one core on attribution at the default interval.

    .venv/bin/python benchmarks/bench_accounting.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace


def best(fn, rounds: int) -> float:
    """The best of five means of ``rounds`` calls, in s of CPU per call."""
    out = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(rounds):
            fn()
        out.append((time.process_time() - t0) / rounds)
    return min(out)


def bare_scan() -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    f.read()
                n += 1
            except OSError:
                pass
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    from aithermd.accounting.procs import ProcessTable
    from aithermd.accounting.service import EnergyService
    from aithermd.clock import FakeClock
    from aithermd.publish.reference import reference_snapshot

    clock = FakeClock()
    service = EnergyService(clock, None, table=ProcessTable(), interval_s=float("inf"))
    service.windows.start("bench", 0.0, uid=0, scope="job:1")
    first_snap = reference_snapshot(1)  # the daemon publishes one device tuple until a hotplug or reload
    snaps = [replace(reference_snapshot(seq), devices=first_snap.devices) for seq in range(1, 1001)]
    it = iter(range(10**9))

    def publish() -> None:
        i = next(it)
        s = snaps[i % len(snaps)]
        service.on_publish(replace(s, seq=i, t_mono=1000.0 + i, t_wall=1.7e9 + i))

    per_snapshot = best(publish, args.rounds)
    table = ProcessTable()
    t0 = time.process_time()
    n = len(table.scan())
    first = time.process_time() - t0
    scan = best(table.scan, max(1, args.rounds // 20))
    bare = best(bare_scan, max(1, args.rounds // 20))
    print(f"per snapshot (meter, windows, pending): {per_snapshot * 1e6:8.1f} µs   (target ≤ 40 µs)")
    print(f"processes on this machine:               {n:8d}")
    print(f"first scan (with identities):            {first * 1e3:8.1f} ms = "
          f"{first / n * 1e6:6.1f} µs/process")
    print(f"later scan (psutil):                     {scan * 1e3:8.1f} ms = {scan / n * 1e6:6.1f} µs/process"
          f"   (target ≤ 100 µs/process)")
    print(f"reference: bare /proc/PID/stat loop:     {bare * 1e3:8.1f} ms = {bare / n * 1e6:6.1f} µs/process")
    print(f"at 500 processes every 5 s: {500 * scan / n / 5 * 100:.2f} % of one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
