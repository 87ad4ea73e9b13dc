"""One power reading 2x or 4x the job's draw inside the efficient search's baseline (attack9 T7): under the
implausibility ceiling (2x the card's maximum limit) it was taken as the job's peak, and the snap to the
job's peak (450 -> 282 W) became a step (450 -> 430.5 -> 411 W). The peak is now one the job held (a
reading another comes within 5 % of) and never over the limit in force: the search decides as without the
glitch. The daemon on the simulated workstation, balanced policy, the fake NVML's reading of gpu0
multiplied once at t = 200 s (the baseline window)."""

from __future__ import annotations

import asyncio
import types

import pytest
from conftest import NOON

from aithermd.settings import DaemonSettings
from aithermd.sim import fake_nvml_lib as lib
from aithermd.sim.runner import SimOptions, simulate
from aithermd.sim.workload import CycleWorkload

GLITCH_S = 200.0  # inside gpu0's baseline (its snap comes at t ~ 288 s)


def glitched(times: float):
    """An ``on_daemon`` hook: gpu0's power fields read ``times`` x the true draw on the one tick at
    :data:`GLITCH_S` (a sensor spike; the energy counter and the physics untouched)."""

    def hook(daemon, machine) -> None:
        fake = machine.nvml
        field = fake._field
        at: list[float] = []  # the simulated second of the one read glitched

        def _field(self, gpu, fid):
            t, v = field(gpu, fid)
            if gpu is fake.gpus[0] and fid in (lib.FI_POWER_AVERAGE, lib.FI_POWER_INSTANT) \
                    and machine.t_s >= GLITCH_S and at in ([], [machine.t_s]):
                at[:] = [machine.t_s]
                return t, int(v * times)
            return t, v

        fake._field = types.MethodType(_field, fake)

    return hook


def limit_changes(tmp_path, times: float) -> list:
    """gpu0's limit changes ``(t_s, old W, new W)`` over 8 simulated minutes (30 s idle, 7 min training, 30 s
    idle; seed 0, where gpu0's job draws well under its 450 W limit: ``pgsearch.sh``'s run)."""
    settings = DaemonSettings(policy="balanced", policy_pinned=True, bus="none", metrics_listen="none",
                              log_level="error")
    opts = SimOptions(duration_s=480.0, speedup=0, seed=0, wall_start=NOON,
                      state_dir=tmp_path / f"x{times:g}", workload=CycleWorkload(30.0, 420.0, 30.0, seed=0),
                      on_daemon=glitched(times))
    result = asyncio.run(simulate(settings, opts, None))
    assert result.code == 0
    return [tuple(c[:3]) for c in result.data["gpus"]["gpu0"]["limit_changes"]]


@pytest.mark.parametrize("times", [2.0, 4.0])
def test_one_high_reading_in_the_baseline_does_not_cancel_the_snap_to_the_jobs_peak(tmp_path, times):
    clean = limit_changes(tmp_path, 1.0)
    t, old, new = next(c for c in clean if c[1] == 450.0)
    assert new < 0.7 * old, "without the glitch: the snap to the job's peak"
    assert limit_changes(tmp_path, times) == clean
