"""Simulated GPUs for the whole-process benchmark: the fake NVML under the real ``pynvml`` bindings, with a
temperature random walk, installed the same way in the daemon and in the lean reference loop.

``install(n, seed)`` puts a :class:`aithermd.sim.fake_nvml.FakeNvml` of ``n`` GPUs (the simulated
workstation's RTX 4090 and RTX 6000 Ada, repeated) beneath the global ``pynvml`` module, so any code that
imports ``pynvml`` afterwards talks to it, and starts one daemon thread that moves every GPU's temperature,
power and utilisation once a second (a random walk: ±1 °C steps between 35 and 85 °C, utilisation and
power following the temperature). Both peers carry the same fake and the same thread, so the ratio
compares only what the controllers do with the readings.

The draw is what training draws (``aithermd/sim/CALIBRATION.md``): from an idle floor of 20 W (the Windows
RTX 4090 trace idles at 17.6 W, the 8× RTX 4090 dump at 20 W; section 2) up to :data:`OWN_SHARE` of the
card's default limit at full utilisation (the RTX 4090 VLM and Windows traces run at a median 0.65 and 0.63
of the 450 W default, no busy second of either reaches 0.9; the Zeus sweeps' own draws have a median of
0.69; sections 1-2), and never above the limit the card enforces (a card holds its draw at its limit, as
the simulator's ``gpu_model`` does). An earlier walk drew 60 + 4 W per % of utilisation, up to 460 W on a
300 W card: an RTX 6000 Ada above 66 °C (58 °C under the reference policy's 80 % limit) drew above its
limit, which a real card does not do, and sat on the fast lane's watch (a GPU over its power limit is
watched whatever its temperature).
"""

from __future__ import annotations

import random
import threading
from typing import Any

_KEEP: list[Any] = []
IDLE_W = 20.0
OWN_SHARE = 0.65  # the draw at full utilisation, as a share of the card's default power limit


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
            power = draw_w(fake, i, util)
            fake.set_dynamic(i, temp_c=temps[i], power_draw_w=power, gpu_util_pct=util)
            fake.add_energy(i, power)


def draw_w(fake: Any, i: int, util_pct: float) -> float:
    """GPU ``i``'s draw (W) at ``util_pct``: idle floor to :data:`OWN_SHARE` of its default limit, at most
    the limit it enforces now."""
    default = fake.gpus[i].profile.default_power_limit_w or fake.power_limit_w(i) or 300.0
    want = IDLE_W + util_pct / 100.0 * (OWN_SHARE * default - IDLE_W)
    enforced = fake.enforced_power_limit_w(i)
    return min(want, enforced) if enforced else want
