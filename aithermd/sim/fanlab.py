"""Fan detection and calibration on the simulated workstation (``aithermd fans ... --simulate``, and
``aithermd run --simulate`` before its daemon starts): the lab's waits move the machine's physics.

:func:`sim_sleep` is the lab's ``sleep`` over a :class:`~aithermd.sim.machine.SimulatedMachine` (or a bare
:class:`~aithermd.sim.board.Board`): it steps the physics by the time asked and moves the simulated clock,
waiting ``seconds / speedup`` of wall time first (0: no waiting)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aithermd.clock import FakeClock

STEP_S = 0.5


def sim_sleep(machine: Any, clock: FakeClock, speedup: float = 0.0, *, cpu_util_pct: float = 5.0,
              gpu_heat_w: float = 0.0) -> Callable[[float], None]:
    """The lab's sleep on ``machine`` (a SimulatedMachine, whose workload sets the load, or a Board, at
    ``cpu_util_pct`` and ``gpu_heat_w``)."""
    step = machine.step

    def sleep(seconds: float) -> None:
        if speedup > 0:
            time.sleep(seconds / speedup)
        left = seconds
        while left > 1e-9:
            dt = min(STEP_S, left)
            if hasattr(machine, "board"):
                step(dt)
            else:
                step(dt, cpu_util_pct=cpu_util_pct, gpu_heat_w=gpu_heat_w)
            clock.advance(dt)
            left -= dt

    return sleep


def calibrate_twin(state_dir: Path, *, seed: int = 0, say: Callable[[str], None] | None = None) -> Path:
    """Detect and calibrate the fans of the simulated workstation on a twin of it (same board, same hidden
    wiring, an idle load, its own temporary directory), as an admin would before the daemon's first start;
    store ``fans.json`` in ``state_dir`` (kept when it is there already). Returns its path. Raises
    LabAborted."""
    from aithermd.fans.store import FANS_FILE

    if (state_dir / FANS_FILE).exists():
        return state_dir / FANS_FILE
    from aithermd.actuate.journal import Journal
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.fans import calibrate, detect
    from aithermd.fans.lab import Lab
    from aithermd.fans.store import save
    from aithermd.sim.machine import SimulatedMachine
    from aithermd.sim.workload import CycleWorkload

    clock = FakeClock()
    with tempfile.TemporaryDirectory(prefix="aithermd-fans-twin-") as tmp:
        idle = CycleWorkload(idle_before_s=86_400.0, training_s=0.0, idle_after_s=0.0, seed=seed)
        machine = SimulatedMachine(Path(tmp) / "machine", seed=seed, workload=idle, wall_start=clock.wall())
        backend = HwmonBackend(str(machine.sysfs_root), io=machine.board.io())
        try:
            devices = backend.discover()
            pwms, tachs = detect.writable_pwms(devices), detect.fan_inputs(devices)
            lab = Lab(backend, devices, Journal(Path(tmp) / "state"), clock=clock,
                      sleep=sim_sleep(machine, clock), say=say)
            with lab:
                setup = detect.detect(lab, pwms, tachs).setup(clock.wall())
                setup = calibrate.calibrate(lab, setup, pwms, clock.wall())
        finally:
            backend.close()
            machine.close()
    return save(state_dir, setup)
