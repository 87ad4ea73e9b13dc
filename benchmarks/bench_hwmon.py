"""A full hwmon sample against a bare ``os.pread`` loop over the same files (issue 2 target: ≤ 3×).

Run: ``.venv/bin/python benchmarks/bench_hwmon.py [SYSFS_ROOT ...]`` (default: every recorded machine in
tests/fixtures/sysfs). For each tree it prints the number of files a sample reads, the best per-sample time
of the bare loop and of ``HwmonBackend.sample()`` (both over descriptors opened beforehand), and the ratio.
Fixture trees are regular files, whose reads cost far less than a driver's ``show()`` on a real /sys, so
the ratio measured here is the pessimistic one. Exit status 1 when a ratio exceeds the target.
"""

from __future__ import annotations

import os
import sys
import timeit
from pathlib import Path

from aithermd.backends.hwmon import HwmonBackend

TARGET = 3.0
ROOT = Path(__file__).resolve().parent.parent
MACHINES = ROOT / "tests" / "fixtures" / "sysfs"


def sample_files(backend: HwmonBackend) -> list[str]:
    """The files one sample reads: every channel input and every pwm/pwm_enable file."""
    paths = [inp.attr.path for inp in backend._inputs]  # noqa: SLF001 - a benchmark looks inside
    for p in backend._pwms.values():  # noqa: SLF001
        paths.append(p.pwm.path)
        if p.enable is not None:
            paths.append(p.enable.path)
    return paths


def best_per_call(fn, number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def bench(root: str, number: int = 2000) -> tuple[int, float, float]:
    backend = HwmonBackend(root)
    backend.discover()
    backend.sample()  # open every descriptor
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in sample_files(backend)]
    pread = os.pread

    def bare() -> None:
        for fd in fds:
            pread(fd, 4096, 0)

    try:
        t_bare = best_per_call(bare, number)
        t_full = best_per_call(backend.sample, number)
    finally:
        for fd in fds:
            os.close(fd)
        backend.close()
    return len(fds), t_bare, t_full


def main(argv: list[str]) -> int:
    roots = argv or [str(p / "sys") for p in sorted(MACHINES.iterdir()) if (p / "sys").is_dir()]
    worst = 0.0
    print(f"{'tree':<64} {'files':>5} {'bare µs':>9} {'sample µs':>9} {'ratio':>6}")
    for root in roots:
        files, t_bare, t_full = bench(root)
        ratio = t_full / t_bare
        worst = max(worst, ratio)
        name = Path(root).parent.name if Path(root).name == "sys" else root
        print(f"{name[:64]:<64} {files:>5} {t_bare * 1e6:>9.1f} {t_full * 1e6:>9.1f} {ratio:>5.2f}×")
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"worst ratio {worst:.2f}× — {verdict} the ≤ {TARGET:g}× target")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
