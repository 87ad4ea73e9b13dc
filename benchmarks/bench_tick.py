"""In-process breakdown: CPU per tick and memory of the control loop on the reference workload (issue 5).

A breakdown, not what users see: ticks run back to back on a simulated clock with only the hwmon backend
(no CPU or NVML backend, no worker hop, metrics, logging or real sleeps), from warm caches.
``bench_process.py`` measures the whole daemon process in real time beside a lean reference loop.

Reference workload: one hwmon chip with 6 temperature inputs and 3 fans (pwm + pwmN_enable + fanN_input),
a policy with a state machine, a points curve with hysteresis, a PID curve and a mix, fan rules with
ramps and a GPU power-limit rule (no GPU), 1 Hz ticks, no GPU, no D-Bus, no metrics. The whole daemon
runs (:class:`aithermd.runtime.daemon.Daemon`: real hwmon backend over a synthetic sysfs tree, real engine, journal,
applier, StateHub) on a simulated clock whose sleep returns at once, so each tick's CPU is measured without
waiting a second between ticks.

CPU: utime + stime of the whole process (all threads) from ``/proc/self/stat`` over a fixed window of ticks
after a warm-up (the policy's windows full, and the StateHub's 900 s snapshot history, a bounded ring,
filled: before that the RSS grows by design). Memory: VmRSS from ``/proc/self/status`` at the start and end
of the window, as MB per simulated hour. The cost of one more sensor: the same run with ``--extra`` more
temperature inputs on a second chip, (CPU/tick − reference CPU/tick) / extra.

Targets: ≤ 0.6 ms CPU per tick, ≤ 2 µs per extra sensor, RSS ≤ 55 MB and flat (≤ 1 MB/hour).

    .venv/bin/python benchmarks/bench_tick.py [--ticks 7200] [--warmup 1000] [--extra 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_tree import reference_chip  # noqa: E402

POLICY = (Path(__file__).resolve().parent / "reference-policy.yaml").read_text()  # the benchmarks' one
CHUNKS = 6  # the window in equal parts: the least loaded part estimates the intrinsic cost on a busy machine


def build_tree(root: Path, extra: int) -> None:
    """A sysfs tree with the reference chip (virtual hwmon) and, when ``extra``, a second chip of extra
    temperature inputs. Values in sysfs units (m°C, RPM, pwm 0–255)."""
    reference_chip(root)
    if extra:
        more = root / "class" / "hwmon" / "hwmon1"
        more.mkdir(parents=True)
        (more / "name").write_text("drivetemp\n")
        for i in range(1, extra + 1):
            (more / f"temp{i}_input").write_text(f"{30_000 + i}\n")


def proc_cpu_s() -> float:
    """utime + stime of this process (all threads), s, from /proc/self/stat (fields 14 and 15)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


async def measure(workdir: Path, extra: int, warmup: int, ticks: int) -> dict[str, float]:
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.clock import FakeClock
    from aithermd.runtime.daemon import Daemon
    from aithermd.settings import DaemonSettings

    root = workdir / f"sys-{extra}"
    build_tree(root, extra)
    policies = workdir / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "reference.yaml").write_text(POLICY)
    settings = DaemonSettings(sysfs_root=root, state_dir=workdir / f"state-{extra}", policy="reference",
                              policy_pinned=True, policy_dirs=[policies], bus="none", metrics_listen="none",
                              nvml=False, tick_s=1.0)
    clock = FakeClock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    cpu_marks: list[float] = []
    rss_marks: list[float] = []
    chunk = max(1, ticks // CHUNKS)
    daemon = Daemon(settings, clock=clock, backends=[HwmonBackend(str(root))], sleep=sleep)

    def until() -> bool:
        seq = daemon.hub.latest.seq
        if seq >= warmup and (seq - warmup) % chunk == 0:
            cpu_marks.append(proc_cpu_s())
            rss_marks.append(rss_mb())
        return seq >= warmup + chunk * CHUNKS

    code = await daemon.run(until=until)
    if code != 0:
        raise SystemExit(f"daemon exited {code}")
    snap = daemon.hub.latest
    assert len(snap.decisions) == 3, snap.decisions  # the three fans are controlled
    per_chunk = sorted((b - a) * 1000.0 / chunk for a, b in zip(cpu_marks, cpu_marks[1:], strict=False))
    return {"cpu_ms_per_tick": (cpu_marks[-1] - cpu_marks[0]) * 1000.0 / (chunk * CHUNKS),
            "cpu_ms_min": per_chunk[0], "rss0_mb": rss_marks[0], "rss1_mb": rss_marks[-1],
            "rss_mb_per_hour": (rss_marks[-1] - rss_marks[0]) / (chunk * CHUNKS / 3600.0),
            "channels": float(len(snap.readings))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=7200, help="ticks in the measured window (1 Hz: 2 h)")
    parser.add_argument("--warmup", type=int, default=1000, help="ticks before the window")
    parser.add_argument("--extra", type=int, default=200, help="extra sensors for the per-sensor cost")
    args = parser.parse_args(argv)
    from aithermd import log
    log.setup("warning", "json")
    with tempfile.TemporaryDirectory() as tmp:
        ref = asyncio.run(measure(Path(tmp), 0, args.warmup, args.ticks))
        more = asyncio.run(measure(Path(tmp), args.extra, args.warmup, args.ticks)) if args.extra else None
    print("in-process breakdown (the whole process in real time: benchmarks/bench_process.py)")
    print(f"reference workload: {ref['channels']:.0f} channels, 3 fans, {args.ticks} ticks at 1 Hz "
          f"(simulated {args.ticks / 3600:.2f} h) after {args.warmup} warm-up ticks")
    print(f"  CPU per tick:        {ref['cpu_ms_per_tick']:.3f} ms over the window, "
          f"{ref['cpu_ms_min']:.3f} ms in its least loaded sixth   (target ≤ 0.6 ms)")
    print(f"  RSS:                 {ref['rss0_mb']:.1f} → {ref['rss1_mb']:.1f} MB   (target ≤ 55 MB)")
    print(f"  RSS growth:          {ref['rss_mb_per_hour']:+.2f} MB/hour   (target ≤ 1 MB/hour)")
    ok = ref["cpu_ms_min"] <= 0.6 and ref["rss1_mb"] <= 55 and ref["rss_mb_per_hour"] <= 1.0
    if more is not None:
        per_sensor_us = (more["cpu_ms_per_tick"] - ref["cpu_ms_per_tick"]) * 1000.0 / args.extra
        per_sensor_min = (more["cpu_ms_min"] - ref["cpu_ms_min"]) * 1000.0 / args.extra
        print(f"  +{args.extra} sensors:         {more['cpu_ms_per_tick']:.3f} ms per tick → "
              f"{per_sensor_us:.2f} µs per extra sensor over the window, "
              f"{per_sensor_min:.2f} µs in the least loaded sixths   (target ≤ 2 µs)")
        ok = ok and per_sensor_min <= 2.0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
