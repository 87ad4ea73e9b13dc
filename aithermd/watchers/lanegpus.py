"""The fast lane's GPUs: which it watches whatever their temperature, and their temperatures read on the
lane's own thread.

- :func:`hot_gpus`: the GPUs drawing more than their power limit (the enforced limit where NVML reports
  one). They heat fastest: the lane watches them whatever their temperature.
- :class:`DirectReads`: the polling thread reads each watched GPU's temperature itself, one NVML call
  (:meth:`NvmlReader.temperature_now <aithermd.backends.readers.NvmlReader.temperature_now>`; NVML is
  thread-safe, nvml.h), instead of handing a job to the backend's NVML worker and waiting for it. A hand-off
  wakes the worker's thread and then the lane's a second time, each wake-up dearer than the read itself,
  up to 12.5 times a second while a GPU is near its trigger: about 0.27 ms of CPU a poll with the hand-off
  (lane 0.19, worker 0.08), 0.19 ms without (benchmarks/bench_process.py gpu8, per-thread schedstat, build
  VM). What the worker's deadline gives the tick, :meth:`DirectReads.overdue` gives the lane: a read that
  has not returned within the backend's read deadline marks its GPU *stuck*, the lane starts a fresh
  thread that leaves it out (and goes on watching everything else), and the GPU is read again once that
  call has returned. A GPU the worker holds hung is not read either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from aithermd.model import DeviceKind, Snapshot


def hot_gpus(devices: Any, snapshot: Snapshot) -> set[str]:
    """Ids of the GPUs of ``devices`` whose power draw in ``snapshot`` is above their power limit (W)."""
    hot = set()
    for d in devices:
        if d.kind != DeviceKind.GPU:
            continue
        power = snapshot.readings.get(f"{d.id}/power")
        kv = snapshot.knobs.get(f"{d.id}/power_limit")
        if power is None or power.value is None or kv is None:
            continue
        limit = (kv.extra or {}).get("enforced_w", kv.value)
        if limit is not None and power.value > limit:
            hot.add(d.id)
    return hot


class DirectReads:
    """GPU temperatures read by the lane's polling threads (one at a time; a stuck one is replaced)."""

    def __init__(self) -> None:
        self.stuck: set[str] = set()  # GPUs whose read has not returned: left out until it has
        self._busy: dict[int, tuple[str, float]] = {}  # thread generation → (GPU, monotonic s) of its read
        self._lock = threading.Lock()

    def temperatures(self, readers: Mapping[str, Any], generation: int = 0) -> dict[str, float | None]:
        """``{channel id: °C or None}`` for ``{channel id: NvmlReader}``, read on the calling thread (of
        ``generation``); None where the GPU is stuck, hung on its worker, or does not answer."""
        out: dict[str, float | None] = {}
        for cid, reader in readers.items():
            gpu = reader.device_id
            if gpu in self.stuck or reader.worker.hung(gpu) is not None:
                out[cid] = None
                continue
            with self._lock:
                self._busy[generation] = (gpu, time.monotonic())
            try:
                out[cid] = reader.temperature_now()
            finally:
                with self._lock:
                    del self._busy[generation]
                    self.stuck.discard(gpu)  # it answered: read again from now on
        return out

    def overdue(self, generation: int, deadline_s: float) -> str | None:
        """The GPU the thread of ``generation`` has been reading for over ``deadline_s`` (s), now marked
        stuck; None when it is not reading or not for that long."""
        with self._lock:
            busy = self._busy.get(generation)
            if busy is None or time.monotonic() - busy[1] <= deadline_s:
                return None
            self.stuck.add(busy[0])
            return busy[0]
