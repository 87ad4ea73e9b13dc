"""Narrow reads for the watchers beside the tick: one input at a time for the fast lane. The backends hand
them out through their public ``reader(channel_id)`` methods (:func:`aithermd.backends.registry.reader_for`);
nothing here reads a backend's private state.

- :class:`HwmonReader`: one hwmon input file (``tempN_input``) through a descriptor of its own (kept open,
  one ``pread``), converted and checked for plausibility (range, sentinels) exactly as the backend's sample
  does (kernel hwmon sysfs ABI, :mod:`aithermd.backends.plausible`). Safe on the event loop: a plain sysfs
  attribute answers in microseconds (slow chips are never offered: they live in
  :mod:`aithermd.backends.slow`).
- :class:`NvmlReader`: one GPU's temperature (°C) and power draw (W) — two NVML calls
  (``nvmlDeviceGetTemperature[V]``, ``nvmlDeviceGetPowerUsage`` in mW) on the backend's NVML worker
  thread, never on the loop; or the temperature alone on the fast lane's own thread
  (:meth:`NvmlReader.temperature_now`, guarded by :mod:`aithermd.watchers.lanegpus`).
  :func:`gpu_temperatures` reads the temperature alone of many GPUs in one job per worker, from a thread
  that waits a few milliseconds at most (:meth:`NvmlWorker.poll
  <aithermd.backends.nvml_worker.NvmlWorker.poll>`).

Every reader answers None for a value it cannot read (failed, lost, nonsense): the fast lane then leaves
that input to the main tick, whose health checks report it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from aithermd import units
from aithermd.backends.sysfs import Attribute


class HwmonReader:
    """One hwmon input through its own kept-open descriptor; ``read()`` → value in the channel's unit
    or None. ``close()`` releases the descriptor."""

    __slots__ = ("channel_id", "_attr", "_convert", "_plausible", "_pread")

    def __init__(self, channel_id: str, attr: Attribute, convert: Callable[[float], float],
                 plausible: Callable[[float], bool]) -> None:
        self.channel_id, self._attr, self._convert, self._plausible = channel_id, attr, convert, plausible

    def read(self) -> float | None:
        try:
            raw = self._attr.read()
        except OSError:
            return None
        if raw[-1:] != b"\n":
            return None
        try:
            value = self._convert(int(raw))
        except ValueError:
            return None
        return value if self._plausible(value) else None

    def close(self) -> None:
        self._attr.close()


class HandleGuard:
    """NVML's handles in use off the worker: readers (the fast lane's threads) never wait, they skip while
    the worker changes handles (``nvmlShutdown`` drops them all); the worker waits for the reads in flight,
    ``wait_s`` at most (a read stuck in a hung GPU never holds it up)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._reads = 0
        self.changing = False

    def enter(self) -> bool:
        """Begin a read; False (read nothing) while the worker changes handles."""
        with self._cond:
            if self.changing:
                return False
            self._reads += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._reads -= 1
            if not self._reads and self.changing:  # the worker waits for it
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, wait_s: float) -> Iterator[None]:
        """No read begins inside; the reads in flight are waited for ``wait_s`` s at most."""
        with self._cond:
            self.changing = True
            self._cond.wait_for(lambda: not self._reads, timeout=wait_s)
        try:
            yield
        finally:
            with self._cond:
                self.changing = False


class NvmlReader:
    """Temperature and power of one GPU: ``gpu`` is the backend's reader of that GPU (an
    :class:`~aithermd.backends.nvml_gpu.GpuReader`), ``worker`` the backend's NVML worker.

    ``read()`` must run on the worker (``await reader.aread(timeout_s)`` from the loop); it returns
    ``(temperature °C | None, power W | None)``."""

    def __init__(self, gpu: Any, worker: Any, device_id: str, deadline_s: float | None = None,
                 handles: HandleGuard | None = None) -> None:
        self.worker = worker
        self.handles = handles  # held exclusively by the worker while NVML's handles change (NvmlBackend)
        self.device_id = device_id
        self.deadline_s = deadline_s  # the backend's read deadline: no progress for that long is a hang
        self._gpu = gpu

    def temperature(self) -> float | None:
        """The GPU's temperature (°C), or None when it does not answer; must run on the worker."""
        fn = self._gpu.temp_fn
        try:
            return None if fn is None else float(fn())
        except Exception:  # noqa: BLE001 - NVMLError, Lost: left to the main tick
            return None

    def temperature_now(self) -> float | None:
        """The GPU's temperature (°C) read on the calling thread: the one NVML call of :meth:`temperature`
        past the worker (NVML is thread-safe, nvml.h) and past its progress beat (a read of the fast lane's
        thread must not pass for progress of the tick's pass); None when it does not answer. The caller
        guards against a call that never returns (:mod:`aithermd.watchers.lanegpus`); while the worker holds
        ``handles`` exclusively (NVML shut down, initialised, handles renewed) nothing is read: None."""
        gpu, guard = self._gpu, self.handles
        raw = getattr(gpu, "temp_raw", None) if gpu.temp_fn is not None else None  # (function, args)
        if raw is None or (guard is not None and not guard.enter()):
            return None
        try:
            return float(getattr(gpu.nv, raw[0])(gpu.handle, *raw[1]))
        except Exception:  # noqa: BLE001 - NVMLError (GPU_IS_LOST included): left to the main tick
            return None
        finally:
            if guard is not None:
                guard.leave()

    def read(self) -> tuple[float | None, float | None]:
        gpu = self._gpu
        temp = power = None
        try:
            if gpu.temp_fn is not None:
                temp = float(gpu.temp_fn())
        except Exception:  # noqa: BLE001 - NVMLError, Lost: left to the main tick
            temp = None
        try:
            power = units.mw_to_w(gpu.call("nvmlDeviceGetPowerUsage"))
        except Exception:  # noqa: BLE001
            power = None
        return temp, power

    async def aread(self, timeout_s: float) -> tuple[float | None, float | None]:
        """``read()`` on the NVML worker; raises BackendTimeout past ``timeout_s``."""
        return await self.worker.call(self.read, timeout_s=timeout_s, gpu=self.device_id)


def gpu_temperatures(readers: Mapping[str, NvmlReader], wait_s: float) -> dict[str, float | None]:
    """Temperature (°C) of the GPU of each ``{channel_id: reader}``, read in one job per NVML worker; None
    where it was not read: the GPU did not answer, is hung, or its worker's job did not end within
    ``wait_s`` (s; see :meth:`~aithermd.backends.nvml_worker.NvmlWorker.poll`)."""
    by_worker: dict[int, list[tuple[str, NvmlReader]]] = {}
    for cid, reader in readers.items():
        by_worker.setdefault(id(reader.worker), []).append((cid, reader))
    out: dict[str, float | None] = dict.fromkeys(readers)
    for group in by_worker.values():
        first = group[0][1]
        by_device = {r.device_id: cid for cid, r in group}
        try:
            got = first.worker.poll([(r.device_id, r) for _, r in group], NvmlReader.temperature, wait_s,
                                    first.deadline_s)
        except Exception:  # noqa: BLE001 - a closed worker (the daemon stopping): the tick reads them
            continue
        for device_id, value in (got or {}).items():
            out[by_device[device_id]] = value
    return out


__all__ = ["HandleGuard", "HwmonReader", "NvmlReader", "gpu_temperatures"]
