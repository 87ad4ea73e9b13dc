"""CPU time of one NVML sample per GPU against the fake NVML (issue 3 target: ≤ 0.3 ms per GPU).

Run: ``.venv/bin/python benchmarks/bench_nvml.py [DUMP ...]`` (default: the 8× RTX 4090, 8× H100 SXM and
10× A40 dumps in tests/fixtures/nvidia-smi-q). One sample is one hop to the NVML worker thread and, per
GPU, one batched ``nvmlDeviceGetFieldValues`` plus the calls no field covers (temperature, utilization,
clocks, clock-event reasons, fans, persistence, pstate), all through the real pynvml bindings and their
ctypes argument handling. Reported: ``time.process_time`` (CPU, every thread of the process) per sample
divided by the GPU count, best of 7 rounds, and the NVML calls made per GPU per sample. The fake's own work
is included, so the figure is an upper bound for the backend's share. Exit status 1 above the target.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from aithermd.backends.nvml import NvmlBackend
from aithermd.sim.fake_nvml import FakeNvml

TARGET_MS = 0.3
ROOT = Path(__file__).resolve().parent.parent
DUMPS = ROOT / "tests" / "fixtures" / "nvidia-smi-q"
DEFAULT = ("rtx4090-x8-nvidia-smi-q.txt", "h100-sxm5-x8-nvidia-smi-q.txt", "a40-x10-nvidia-smi-q.txt")


def count_calls(fake: FakeNvml, backend: NvmlBackend) -> int:
    """NVML C calls one sample makes (all GPUs)."""
    calls = 0
    saved = {name: fn._impl for name, fn in fake._functions.items()}  # noqa: SLF001 - a benchmark looks inside

    def counting(impl):
        def call(*args):
            nonlocal calls
            calls += 1
            return impl(*args)

        return call

    for name, fn in fake._functions.items():  # noqa: SLF001
        fn._impl = counting(saved[name])  # noqa: SLF001
    backend.sample()
    for name, fn in fake._functions.items():  # noqa: SLF001
        fn._impl = saved[name]  # noqa: SLF001
    return calls


def bench(path: Path, number: int = 200, repeat: int = 7) -> tuple[int, float, float]:
    fake = FakeNvml.from_dumps([path], fan_count=2)
    backend = NvmlBackend(nvml=fake.bindings())
    try:
        gpus = len(backend.discover())
        backend.sample()  # warm: function pointers cached, worker thread started
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            for _ in range(number):
                backend.sample()
            best = min(best, (time.process_time() - t0) / number)
        calls = count_calls(fake, backend) / gpus
        return gpus, best * 1000.0 / gpus, calls
    finally:
        backend.close()


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [DUMPS / name for name in DEFAULT]
    worst = 0.0
    print(f"{'dump':<45} {'GPUs':>4} {'ms CPU/GPU':>10} {'calls/GPU':>9}")
    for path in paths:
        gpus, ms, calls = bench(path)
        worst = max(worst, ms)
        print(f"{path.name:<45} {gpus:>4} {ms:>10.3f} {calls:>9.0f}")
    print(f"worst {worst:.3f} ms CPU per GPU per sample (target ≤ {TARGET_MS} ms)")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
