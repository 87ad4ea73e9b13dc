"""Replay speed (issue 4 target: one hour of 8 GPUs at 1 Hz in ≤ 1 s) and the parsed trace's memory.

Run: ``.venv/bin/python benchmarks/bench_replay.py [POLICY]`` (default ai-training). Builds a synthetic
nvidia-smi trace — 3600 samples × 8 GPUs with an index column, idle → load with dips → idle per GPU at
staggered times — then times parsing plus the replay (the real engine every sample) on RTX 4090 profiles
from a real ``-x`` dump. Prints the best of 3 runs. Then the memory the parsed trace holds (tracemalloc, per
GPU row): a long trace must not cost many times its bytes (attack4 B8: 81 MB of trace took 1.58 GB of RSS;
each row held ~975 B of its own strings and dicts). Exit status 1 above either target.
"""

from __future__ import annotations

import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

from aithermd.policy.loader import resolve_policy
from aithermd.policy.replay import replay
from aithermd.policy.trace import parse_trace
from aithermd.sim.smi_dump import load_dump

TARGET_S = 1.0
TARGET_ROW_BYTES = 600  # per GPU row of the parsed trace (before B8's fix: ~975 B on the 4090 trace)
ROOT = Path(__file__).resolve().parent.parent
DUMP = ROOT / "tests" / "fixtures" / "nvidia-smi-q" / "rtx4090-nvidia-smi-q-x-driver535.xml"
GPUS, SECONDS = 8, 3600


def synthetic_trace(seed: int = 1) -> str:
    rng = random.Random(seed)
    lines = ["timestamp, index, name, utilization.gpu [%], power.draw [W], temperature.gpu"]
    t0 = time.mktime((2026, 1, 3, 10, 0, 0, 0, 0, -1))
    for s in range(SECONDS):
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0 + s))
        for g in range(GPUS):
            loaded = 300 + 60 * g <= s < 3000 - 40 * g and rng.random() > 0.03
            util = rng.uniform(60, 99) if loaded else rng.uniform(0, 3)
            power = rng.uniform(250, 330) if loaded else rng.uniform(25, 35)
            temp = 45 + util / 5
            lines.append(f"{stamp}.{g * 3:03d}, {g}, NVIDIA GeForce RTX 4090, {util:.0f} %, {power:.2f} W, {temp:.0f}")
    return "\n".join(lines) + "\n"


def main() -> int:
    policy = resolve_policy(sys.argv[1] if len(sys.argv) > 1 else "ai-training")
    profiles = load_dump(DUMP)
    text = synthetic_trace()
    best, best_parse, doc = float("inf"), 0.0, None
    for _ in range(3):
        t0 = time.perf_counter()
        trace = parse_trace(text)
        t1 = time.perf_counter()
        doc = replay(trace, [profiles[0]] * GPUS, policy)
        t2 = time.perf_counter()
        if t2 - t0 < best:
            best, best_parse = t2 - t0, t1 - t0
    assert doc is not None
    changes = sum(g["limit_changes"] for g in doc["summary"]["gpus"].values())
    print(f"replay {policy.name}: {SECONDS} samples × {GPUS} GPUs ({SECONDS * GPUS} rows): "
          f"{best:.3f} s (parse {best_parse:.3f} s, engine {best - best_parse:.3f} s; "
          f"{1e6 * (best - best_parse) / SECONDS:.0f} µs per tick); {changes} limit changes; target ≤ {TARGET_S} s")
    del trace, doc
    gc.collect()
    tracemalloc.start()
    held = parse_trace(text)
    row_bytes = tracemalloc.get_traced_memory()[0] / (SECONDS * GPUS)
    tracemalloc.stop()
    assert len(held.samples) == SECONDS
    print(f"parsed trace: {row_bytes:.0f} B per GPU row ({len(text) / (SECONDS * GPUS):.0f} B of text); "
          f"target ≤ {TARGET_ROW_BYTES} B")
    return 0 if best <= TARGET_S and row_bytes <= TARGET_ROW_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
