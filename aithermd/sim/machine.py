"""The simulated workstation: real GPUs (fake NVML built from real dumps) on a real board, moved by physics.

:class:`SimulatedMachine` owns a directory of its own holding the board's sysfs tree (``sys/``) and the
fake NVML's state file (``nvml-state.json``). Each :meth:`SimulatedMachine.step` advances simulated time:

1. reads what the daemon set — GPU power limits, locked SM clocks and fan targets/modes through the fake
   NVML, pwm and RAPL limits through the board's files;
2. asks the workload for each GPU's load (utilization, demand, the job behind it), runs each GPU through
   :func:`aithermd.sim.gpu_model.gpu_step` (the power-limit law fitted on the Zeus sweeps, the job's
   clock law, the driver's thermal slowdown) and its two-node cooler (:mod:`aithermd.sim.gpu_sim`) with
   its fans and the case air as intake, and its stock twin beside it;
3. writes what NVML would show: ``set_dynamic``/``add_energy`` on the fake NVML, temperatures, RPMs and
   RAPL energy in the board's files; the processes on the GPUs (:mod:`aithermd.sim.processes`: the default
   cast follows the workload's phases) get their utilization samples, CPU time and ``/proc`` files (under
   ``proc/``). Temperatures and RPMs are what the sensors would report of the true state, quantized and
   jittered by :mod:`aithermd.sim.sensor_noise`; the physics, the hidden work and the summary keep the
   truth.

:meth:`summary` totals energy, work, work per joule against the stock twin, time per workload phase,
limit changes, fan duty changes and peak temperatures.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aithermd.sim.board import Board
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.gpu_sim import SimGpu, step_card
from aithermd.sim.processes import DefaultScenario, SimProcesses
from aithermd.sim.profiles import shipped_profiles
from aithermd.sim.sensor_noise import NVML_GPU, SensorNoise
from aithermd.sim.workload import IDLE, CycleWorkload, Workload

# The default machine: an RTX 4090 (max limit 600 W above its 450 W default: raising pays) and an RTX 6000
# Ada (max = default = 300 W: "raise" can only mean "return from a relaxed limit").
DEFAULT_PROFILES = ("rtx4090", "rtx6000-ada")
NVML_STATE = "nvml-state.json"


def default_profiles() -> list[GpuProfile]:
    """The shipped profiles of :data:`DEFAULT_PROFILES`, in order."""
    shipped = shipped_profiles()
    return [shipped[slug] for slug in DEFAULT_PROFILES]


CPU_THREADS = 24  # a 12-core, 24-thread Ryzen 9 on the X570 board
CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
CpuFreq = namedtuple("CpuFreq", "current min max")


class SimPsutil:
    """The parts of :mod:`psutil` the CPU backend calls, answering for the simulated CPU: per-CPU times
    that advance with simulated time at the workload's utilization, a load average that follows it, and a
    frequency between base and boost. Pass it as ``CpuBackend(psutil_module=...)``. Two reads at the same
    simulated instant still see one jiffy (10 ms, ``USER_HZ`` 100) of idle time pass, as on a real CPU,
    where some time always passes between two reads."""

    def __init__(self, threads: int = CPU_THREADS) -> None:
        self.threads = threads
        self._busy_s = 0.0
        self._idle_s = 0.0
        self.util_pct = 0.0
        self._load = 0.0
        self._last_read: tuple[float, float] | None = None

    def advance(self, dt_s: float, util_pct: float) -> None:
        util = min(100.0, max(0.0, util_pct)) / 100.0
        self.util_pct = util * 100.0
        self._busy_s += util * dt_s
        self._idle_s += (1.0 - util) * dt_s
        self._load += (util * self.threads - self._load) * min(1.0, dt_s / 60.0)  # the kernel's 1-min EMA

    def cpu_times(self, percpu: bool = False) -> list[CpuTimes] | CpuTimes:
        if (self._busy_s, self._idle_s) == self._last_read:
            self._idle_s += 0.01
        self._last_read = (self._busy_s, self._idle_s)
        busy = self._busy_s
        one = CpuTimes(busy * 0.85, 0.0, busy * 0.15, self._idle_s, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        if not percpu:
            return CpuTimes(*(v * self.threads for v in one))
        return [one] * self.threads

    def getloadavg(self) -> tuple[float, float, float]:
        return (self._load, self._load, self._load)

    def cpu_freq(self, percpu: bool = False) -> CpuFreq:
        return CpuFreq(3800.0 + 800.0 * self.util_pct / 100.0, 2200.0, 4600.0)

    def cpu_count(self, logical: bool = True) -> int:
        return self.threads if logical else self.threads // 2


class SimulatedMachine:
    """A workstation under ``root`` (created if missing; must not hold a machine yet).

    ``profiles``: the GPUs (default :func:`default_profiles`); ``workload``: the load (default the 2/6/2
    minute :class:`CycleWorkload`); ``seed`` makes noise reproducible; ``sensor_noise`` False quantizes
    readings without jitter; ``fan_dies``: board tach → simulated second its fan seizes. Raises
    ``FileExistsError`` when ``root`` already holds a machine,
    ``ValueError`` for a profile without a power limit.
    """

    def __init__(self, root: str | Path, *, profiles: Sequence[GpuProfile] | None = None,
                 workload: Workload | None = None, seed: int = 0, sensor_noise: bool = True,
                 wall_start: float = 0.0, fan_dies: Mapping[str, float] | None = None) -> None:
        self.root = Path(root)
        self.wall_start = wall_start  # the simulated wall clock at t_s = 0 (process start times, samples)
        self.root.mkdir(parents=True, exist_ok=True)
        self.profiles = list(profiles) if profiles is not None else default_profiles()
        self.workload: Workload = workload if workload is not None else CycleWorkload(seed=seed)
        self.board = Board.create(self.root, seed=seed, sensor_noise=sensor_noise, fan_dies=fan_dies)
        self.gpu_noise = SensorNoise(seed, "gpu", enabled=sensor_noise)
        self.psutil = SimPsutil()
        self.nvml_state_path = self.root / NVML_STATE
        self.nvml = FakeNvml(self.profiles, state_path=self.nvml_state_path)
        for gpu in self.nvml.gpus:  # the dumps' processes belong to other machines: this one has its own cast
            gpu.processes.clear()
        self.processes = SimProcesses(self.root / "proc", self.nvml)
        self.scenario = DefaultScenario(self.processes, len(self.profiles))
        self.t_s = 0.0
        self.phase_s: dict[str, float] = {}
        self.fan_changes: list[tuple[float, str, int]] = []  # (t_s, pwm file, raw value) in manual mode
        self._last_pwm: dict[str, int] = {}
        self.peak_cpu_c = 0.0
        self.peak_case_c = 0.0
        self.cpu_energy_j = 0.0
        self.gpus: list[SimGpu] = [SimGpu.create(prof, self.nvml.power_limit_w(i))
                                   for i, prof in enumerate(self.profiles)]

    @property
    def sysfs_root(self) -> Path:
        return self.board.sysfs_root

    def step(self, dt_s: float) -> None:
        """Advance the machine by ``dt_s`` simulated seconds (> 0). Raises ``ValueError`` otherwise."""
        if dt_s <= 0:
            raise ValueError(f"dt_s must be > 0, got {dt_s}")
        t = self.t_s
        phase = self.workload.phase(t)
        wall = self.wall_start + t + dt_s
        self.scenario.update(phase != IDLE, wall - dt_s)
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + dt_s
        gpu_heat = 0.0
        air = self.board.case_air_c
        for i, g in enumerate(self.gpus):
            gpu_heat += g.cooling.heat_into_case * self._step_gpu(i, g, t, dt_s, air)
        self.processes.step(wall, dt_s, lambda i: self.workload.gpu_util_pct(i, t))
        cpu_util = self.workload.cpu_util_pct(t)
        self.psutil.advance(dt_s, cpu_util)
        state = self.board.step(dt_s, cpu_util_pct=cpu_util, gpu_heat_w=gpu_heat)
        self.cpu_energy_j += state.cpu_power_w * dt_s
        self.peak_cpu_c = max(self.peak_cpu_c, state.cpu_c)
        self.peak_case_c = max(self.peak_case_c, state.case_air_c)
        self.t_s = t + dt_s
        self._watch_fans()

    def _step_gpu(self, i: int, g: SimGpu, t: float, dt_s: float, air_c: float) -> float:
        limit = self.nvml.power_limit_w(i)
        if limit != g.last_limit_w:
            g.limit_changes.append((t, g.last_limit_w or 0.0, limit or 0.0))
            g.last_limit_w = limit
        enforced = self.nvml.enforced_power_limit_w(i) or limit or g.params.default_w
        load = self.workload.gpu_load(i, t)
        case_duty = self.board.case_fan_duty_pct()
        duties = [None if self.nvml.fan_auto(i, f) else float(self.nvml.fan_target_pct(i, f))
                  for f in range(g.fans)] if g.fans else None
        out, auto = step_card(g.params, g.cooling, g.card, load, limit_w=enforced,
                              lock_mhz=self.nvml.locked_clock_max_mhz(i), fan_duties=duties,
                              case_duty_pct=case_duty, air_c=air_c, dt_s=dt_s,
                              target_temp_c=g.profile.target_temp_c or 84.0)
        g.step_twin(load, case_duty, air_c, dt_s)
        load_share = (out.power_w - g.params.idle_w) / max(1.0, g.params.default_w - g.params.idle_w)
        noise = self.gpu_noise
        self.nvml.set_dynamic(
            i, temp_c=noise.temp_c(NVML_GPU, g.card.temp_c, load_share), power_draw_w=out.power_w,
            gpu_util_pct=out.util_pct, memory_util_pct=out.memory_util_pct, sm_clock_mhz=out.sm_clock_mhz,
            memory_temp_c=(noise.temp_c(NVML_GPU, g.card.temp_c + 6, load_share)
                           if g.profile.memory_temp_c is not None else None),
            clock_event_reasons=out.reasons, fan_speed_pct=auto if g.fans else None, pstate=out.pstate,
            gpm_tensor_pct=out.gpm_tensor_pct)
        self.nvml.add_energy(i, out.power_w * dt_s, dt_s)
        return out.power_w

    def _watch_fans(self) -> None:
        """Record pwm values the daemon set in manual mode (for "how often does a fan change")."""
        for key, header in self.board.headers.items():
            mode = header.enable.read_int() if header.enable is not None else 1
            raw = header.pwm.read_int()
            if mode != 1 or raw is None:
                self._last_pwm.pop(key, None)
                continue
            if self._last_pwm.get(key) != raw:
                self.fan_changes.append((self.t_s, key, raw))
                self._last_pwm[key] = raw

    def summary(self) -> dict[str, Any]:
        """Totals so far: ``duration_s``, ``energy_j`` (GPUs + CPU package), ``work`` (seconds of full-speed
        training, summed over GPUs), ``work_per_kj``, ``phase_s`` (time per workload phase) and per GPU
        ``energy_j``, ``work``, ``work_per_kj``, ``peak_temp_c``, ``slowdown_temp_c``, ``slowdown_s``,
        ``limit_changes`` [(t_s, old_w, new_w)], ``final_limit_w`` (the limit now: after a daemon's exit, the
        one it restored); ``stock``: the stock twins' ``gpu_energy_j`` (GPUs only, as ``gpu_energy_j``: the
        twin has no CPU), ``work``, ``work_per_kj``; ``peak_cpu_c``, ``peak_case_c``,
        ``fan_changes`` (count of pwm changes in manual mode)."""
        gpus = {}
        for i, g in enumerate(self.gpus):
            gpus[f"gpu{i}"] = {
                "name": g.profile.name, "energy_j": round(g.energy_j, 1), "work": round(g.work, 2),
                **g.totals(),
                "peak_temp_c": round(g.peak_temp_c, 1), "slowdown_temp_c": g.params.slowdown_temp_c,
                "slowdown_s": g.slowdown_s, "limit_changes": [list(c) for c in g.limit_changes],
                "final_limit_w": self.nvml.power_limit_w(i),
                "default_limit_w": g.profile.default_power_limit_w,
                "max_limit_w": g.profile.max_power_limit_w,
            }
        gpu_energy = sum(g.energy_j for g in self.gpus)
        work = sum(g.work for g in self.gpus)
        stock_energy = sum(g.twin.energy_j for g in self.gpus)
        stock_work = sum(g.twin.work for g in self.gpus)
        wpk = 1000.0 * work / gpu_energy if gpu_energy else 0.0
        stock_wpk = 1000.0 * stock_work / stock_energy if stock_energy else 0.0
        return {
            "duration_s": round(self.t_s, 3), "energy_j": round(gpu_energy + self.cpu_energy_j, 1),
            "gpu_energy_j": round(gpu_energy, 1), "cpu_energy_j": round(self.cpu_energy_j, 1),
            "work": round(work, 2),
            "work_per_kj": round(wpk, 4),
            "stock": {"gpu_energy_j": round(stock_energy, 1), "work": round(stock_work, 2),
                      "work_per_kj": round(stock_wpk, 4)},
            "work_per_j_gain_pct": round(100.0 * (wpk / stock_wpk - 1.0), 2) if stock_wpk else 0.0,
            "slowdown_pct": round(100.0 * (1.0 - work / stock_work), 2) if stock_work > 0 else 0.0,
            "phase_s": {k: round(v, 1) for k, v in self.phase_s.items()}, "gpus": gpus,
            "peak_cpu_c": round(self.peak_cpu_c, 1), "peak_case_c": round(self.peak_case_c, 1),
            "fan_changes": len(self.fan_changes),
        }

    def close(self) -> None:
        """Release files and the fake NVML; the directory stays (see the runner for its removal)."""
        self.board.close()
        close = getattr(self.nvml, "close", None)
        if close is not None:
            close()
