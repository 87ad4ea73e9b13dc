"""What the simulator (and tests) do to the fake NVML's GPUs from outside NVML: drive the readings, advance
the energy counter, read back what NVML writes set, make GPUs vanish. Daemon units (°C, W, J, %, MHz);
``index`` is the position in the profile list, stable even after :meth:`SimulatorControls.remove_gpu`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from aithermd.sim.fake_nvml_state import FakeGpu, FakeProcess, reasons_mask
from aithermd.units import mw_to_w, w_to_mw


class SimulatorControls:
    """Mixin of :class:`~aithermd.sim.fake_nvml.FakeNvml` (which provides ``gpus``, ``_lock``, ``_sync``
    and ``_persist``)."""

    gpus: list[FakeGpu]
    _lock: threading.RLock

    _sync: Any
    _persist: Any

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def lose_gpu(self, index: int) -> None:
        """The GPU fell off the bus: every call on it fails with GPU_IS_LOST; it stays enumerated."""
        self._set_flag(index, "lost", True)

    def remove_gpu(self, index: int) -> None:
        """The GPU vanished: old handles fail with GPU_IS_LOST and it is no longer enumerated."""
        self._set_flag(index, "removed", True)

    def revive_gpu(self, index: int) -> None:
        """The GPU is back (after a reset or a re-plug): enumerated again, with new handles (a handle taken
        before answers GPU_IS_LOST, as after a real GPU reset) and the driver's settings as at its load: the
        power limit at its default, fans on the automatic curve, clocks unlocked (a management limit "is not
        persistent across reboots or driver unloads": NVML API reference, nvmlDeviceSetPowerManagementLimit;
        a reset initialises the GPU again)."""
        with self._lock:
            self._sync()
            gpu = self.gpus[index]
            if gpu.lost or gpu.removed:
                gpu.epoch += 1
                if gpu.default_mw is not None:
                    gpu.limit_mw = gpu.default_mw
                for fan in gpu.fans:
                    fan.manual, fan.target_pct = False, fan.auto_pct
                gpu.locked_clocks = None
            gpu.lost = gpu.removed = False
            self._persist()

    def _set_flag(self, index: int, flag: str, value: bool) -> None:
        with self._lock:
            self._sync()
            setattr(self.gpus[index], flag, value)
            self._persist()

    def set_dynamic(
        self,
        index: int,
        *,
        temp_c: float | None = None,
        memory_temp_c: float | None = None,
        power_draw_w: float | None = None,
        gpu_util_pct: float | None = None,
        memory_util_pct: float | None = None,
        sm_clock_mhz: float | None = None,
        memory_clock_mhz: float | None = None,
        clock_event_reasons: Iterable[str] | int | None = None,
        fan_speed_pct: float | Sequence[float] | None = None,
        persistence_mode: bool | None = None,
        pstate: str | None = None,
        gpm_tensor_pct: float | None = None,
    ) -> None:
        """Set what the GPU reads now (daemon units; None leaves a value unchanged). ``fan_speed_pct`` (one
        value for every fan, or one per fan) is the automatic curve's duty: it moves fans in automatic mode,
        fans under manual control keep their target. ``clock_event_reasons``: names or the bit mask;
        ``pstate``: ``"P0"`` … ``"P12"``; ``gpm_tensor_pct`` the tensor-pipe activity GPM will integrate
        (see :meth:`add_energy`)."""
        with self._lock:
            g = self.gpus[index]
            for name, value in (
                ("temp_c", temp_c),
                ("memory_temp_c", memory_temp_c),
                ("persistence", persistence_mode),
                ("pstate", pstate),
            ):
                if value is not None:
                    setattr(g, name, value)
            if power_draw_w is not None:
                g.power_mw = w_to_mw(power_draw_w)
            for name, value in (
                ("gpu_util_pct", gpu_util_pct),
                ("memory_util_pct", memory_util_pct),
                ("sm_clock_mhz", sm_clock_mhz),
                ("memory_clock_mhz", memory_clock_mhz),
            ):
                if value is not None:
                    setattr(g, name, int(round(value)))
            if clock_event_reasons is not None:
                g.reasons = reasons_mask(clock_event_reasons)
            if gpm_tensor_pct is not None:
                g.gpm_tensor_pct = gpm_tensor_pct
            if fan_speed_pct is not None:
                duties = (
                    [fan_speed_pct] * len(g.fans)
                    if isinstance(fan_speed_pct, int | float)
                    else list(fan_speed_pct)
                )
                for fan, duty in zip(g.fans, duties, strict=False):
                    fan.auto_pct = int(round(max(0.0, min(100.0, duty))))
                    if not fan.manual:
                        fan.speed_pct = fan.target_pct = fan.auto_pct

    def add_energy(self, index: int, joules: float, dt_s: float = 0.0) -> None:
        """Advance the GPU's total-energy counter (read in mJ) by ``joules``, and its GPM counters by
        ``dt_s`` seconds at the present utilization and tensor activity."""
        with self._lock:
            g = self.gpus[index]
            g.energy_mj += int(round(joules * 1000.0))
            if dt_s > 0:
                g.gpm_elapsed_s += dt_s
                g.gpm_busy_s += dt_s * (g.gpu_util_pct or 0) / 100.0
                g.gpm_tensor_s += dt_s * g.gpm_tensor_pct / 100.0

    def locked_clock_max_mhz(self, index: int) -> float | None:
        """The upper SM clock (MHz) of the range locked through NVML, clamped to what the card supports;
        None when the clocks are not locked."""
        from aithermd.sim.fake_nvml_clocks import effective_lock

        with self._lock:
            self._sync()
            lock = effective_lock(self.gpus[index])
            return None if lock is None else float(lock[1])

    def power_limit_w(self, index: int) -> float | None:
        """The management power limit now in force (W), as last set through NVML or the shared file."""
        with self._lock:
            self._sync()
            mw = self.gpus[index].limit_mw
            return None if mw is None else mw_to_w(mw)

    def quantise_power(self, index: int, step_w: float | None = None, floor_w: float | None = None) -> None:
        """GPU ``index``'s driver keeps a power limit it is set to only in ``step_w`` steps (the nearest,
        within the constraints) and not under ``floor_w`` (above the minimum it reports): the set call
        succeeds, and the limit read back is what it kept. None: as asked."""
        with self._lock:
            gpu = self.gpus[index]
            gpu.limit_step_mw = None if step_w is None else w_to_mw(step_w)
            gpu.limit_floor_mw = None if floor_w is None else w_to_mw(floor_w)

    def refuse_power_below(self, index: int, floor_w: float | None) -> None:
        """GPU ``index``'s driver answers NVML_ERROR_INVALID_ARGUMENT to a power limit under ``floor_w``
        although its constraints report a lower minimum (nvidia-smi: "is not a valid power limit"; vGPU,
        notebooks under Dynamic Boost). None: only outside the constraints."""
        with self._lock:
            self.gpus[index].limit_refused_below_mw = None if floor_w is None else w_to_mw(floor_w)

    def enforced_power_limit_w(self, index: int) -> float | None:
        with self._lock:
            self._sync()
            mw = self.gpus[index].enforced_mw
            return None if mw is None else mw_to_w(mw)

    def fan_count(self, index: int) -> int:
        return len(self.gpus[index].fans)

    def fan_target_pct(self, index: int, fan: int) -> int:
        with self._lock:
            self._sync()
            return self.gpus[index].fans[fan].target_pct

    def fan_auto(self, index: int, fan: int) -> bool:
        with self._lock:
            self._sync()
            return not self.gpus[index].fans[fan].manual

    # ---- processes (see aithermd.sim.fake_nvml_procs) ----
    def start_process(self, index: int, pid: int, *, memory_mib: float | None = 0.0, compute: bool = True,
                      graphics: bool = False, gpu_instance_id: int | None = None,
                      compute_instance_id: int | None = None) -> None:
        """A process opens a context on GPU ``index`` holding ``memory_mib`` (None: NVML cannot tell);
        starting a pid already there updates it."""
        with self._lock:
            self.gpus[index].processes[pid] = FakeProcess(
                pid, compute=compute, graphics=graphics,
                used_memory_bytes=None if memory_mib is None else int(memory_mib * (1 << 20)),
                gpu_instance_id=gpu_instance_id, compute_instance_id=compute_instance_id)

    def stop_process(self, index: int, pid: int) -> None:
        """The process left GPU ``index`` (its samples stay in the driver's ring until pushed out)."""
        with self._lock:
            self.gpus[index].processes.pop(pid, None)

    def process_pids(self, index: int) -> list[int]:
        with self._lock:
            return list(self.gpus[index].processes)

    def add_process_samples(self, index: int, timestamp_us: int,
                            utils: dict[int, tuple[float, float, float, float]]) -> None:
        """One driver sample period on GPU ``index``: ``{pid: (sm %, memory %, encoder %, decoder %)}``;
        processes whose utilization rounds to zero get no sample, as on real drivers."""
        with self._lock:
            ring = self.gpus[index].util_samples
            for pid, values in utils.items():
                sm, mem, enc, dec = (int(round(min(100.0, max(0.0, v)))) for v in values)
                if sm or mem or enc or dec:
                    ring.append((int(timestamp_us), pid, sm, mem, enc, dec))
