"""Simulated GPUs for the whole-process benchmark: the fake NVML under the real ``pynvml`` bindings, with a
temperature random walk, installed the same way in the daemon and in the lean reference loop.

``install(n, seed)`` puts a :class:`aithermd.sim.fake_nvml.FakeNvml` of ``n`` GPUs (the simulated
workstation's RTX 4090 and RTX 6000 Ada, repeated) beneath the global ``pynvml`` module, so any code that
imports ``pynvml`` afterwards talks to it, and starts one daemon thread that moves every GPU's temperature,
power and utilisation once a second (a random walk: ±1 °C steps between 35 and 85 °C, power following the
temperature). Both peers carry the same fake and the same thread, so the ratio compares only what the
controllers do with the readings.
"""

from __future__ import annotations

import random
import threading
from typing import Any


_KEEP: list[Any] = []


def install(n: int, seed: int = 0) -> Any:
    """Install ``n`` fake GPUs into ``pynvml``; returns the FakeNvml (0: nothing installed, None)."""
    if n <= 0:
        return None
    import pynvml

    from aithermd.sim.fake_nvml import FakeNvml
    from aithermd.sim.machine import default_profiles

    pair = default_profiles()
    fake = FakeNvml([pair[i % len(pair)] for i in range(n)])
    installed = fake.install(pynvml)
    installed.__enter__()  # for the life of the process: a collected context manager would undo it
    _KEEP.append(installed)
    threading.Thread(target=_walk, args=(fake, n, seed), name="bench-gpu-walk", daemon=True).start()
    return fake


def _walk(fake: Any, n: int, seed: int) -> None:
    rng = random.Random(seed)
    temps = [45.0 + 3 * i for i in range(n)]
    stop = threading.Event()
    while not stop.wait(1.0):
        for i in range(n):
            temps[i] = min(85.0, max(35.0, temps[i] + rng.choice((-1.0, 0.0, 1.0))))
            util = min(100.0, max(0.0, (temps[i] - 35.0) * 2.0))
            fake.set_dynamic(i, temp_c=temps[i], power_draw_w=60.0 + 4.0 * util, gpu_util_pct=util)
            fake.add_energy(i, 60.0 + 4.0 * util)
