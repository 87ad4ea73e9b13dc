"""A process that ends between two accounting passes (every 5 s) is charged its last seconds under its own
identity, and a window stopped as its command ends gets them (attack8 T6). The tests' Bench: real NVML
backend over the fake NVML, real EnergyService, process table over a fake /proc; J, W, s."""

from __future__ import annotations

import asyncio

import pytest

from aithermd.sim.processes import SimProcess
from tests.accounting.bench import Bench


def test_a_process_that_ends_between_passes_is_charged_to_its_job(tmp_path):
    """Slurm job 501 seen by two passes ends 2 s after the second: NVML's utilization samples of its pid
    still name it at the next pass, which charges its job, not an anonymous pid (was 3 000 of 3 600 J)."""
    b = Bench(tmp_path, gpus=1)
    service = b.start_daemon(None)
    b.util[0], b.power["gpu0"] = 100.0, 300.0
    b.job(8001, 501, {0: 1.0})
    b.run(12)  # passes at 5 and 10 s; it ends at 12 s
    b.procs.stop(8001)
    b.util[0], b.power["gpu0"] = 0.0, 25.0
    b.run(3)
    b.run(5)
    groups = service.processes_document()["groups"]
    assert groups["job"]["slurm:501"]["gpu0"] == pytest.approx(12 * 300.0 + 25.0 * 8, rel=0.05)
    assert all(not r["command"].startswith("pid ") for r in service.processes_document()["processes"])


def energy_command(b: Bench, service) -> int:
    """``aithermctl energy -- python bench.py`` started now (pid 9000, its window scoped to it) and its job
    (pid 9001) computing on gpu0 at 300 W; the window id."""
    b.procs.start(SimProcess(9000, "aithermctl", ["aithermctl", "energy", "--", "python", "bench.py"],
                             "0::/user.slice\n", uid=1000, start_wall=b.clock.wall()))
    wid = service.windows.start("bench", 0.0, uid=1000, scope="pid:9000")
    b.procs.start(SimProcess(9001, "python", ["python", "bench.py"], "0::/user.slice\n", uid=1000, ppid=9000,
                             start_wall=b.clock.wall(), gpus={0: (8000.0, 1.0)}))
    b.util[0], b.power["gpu0"] = 100.0, 300.0
    return wid


def test_a_window_stopped_as_its_command_ends_gets_the_seconds_since_the_last_pass(tmp_path):
    """``aithermctl energy -- CMD`` (scope ``pid:<aithermctl>``) for a 4 s job: the command has exited, not
    yet reaped, when the window is stopped; the settling pass charges its 4 s (was 0 J: −100 %)."""
    b = Bench(tmp_path, gpus=1)
    service = b.start_daemon(None)
    b.run(5)
    wid = energy_command(b, service)
    b.run(4)

    async def stop() -> dict:
        assert service.windows.scoped(wid, 1000) and not service.windows.scoped(wid, 1001)
        await service.settle()
        return service.windows.stop(wid, uid=1000)

    doc = asyncio.run(stop())
    assert doc["attributed"]["gpu0"] == pytest.approx(b.truth[(9001, "gpu0")]) == pytest.approx(4 * 300.0)


@pytest.mark.parametrize("job_s", [4, 7, 12])
def test_a_window_opened_between_passes_is_charged_only_its_own_seconds(tmp_path, job_s):
    """The same, the window opened 3 s after the daemon's start (no pass yet): the first pass's 3 s before
    it are no part of it. Its ``attributed`` is the job's own energy and never more than the device's
    joules inside the window (attack9 T6: 1,275 of 1,200 J for the 4 s job, the 3 s of idle floor before)."""
    b = Bench(tmp_path, gpus=1)
    service = b.start_daemon(None)
    b.run(3)
    wid = energy_command(b, service)
    b.run(job_s)

    async def stop() -> dict:
        await service.settle()
        return service.windows.stop(wid, uid=1000)

    doc = asyncio.run(stop())
    assert doc["joules"]["gpu0"] == pytest.approx(job_s * 300.0)
    assert doc["attributed"]["gpu0"] == pytest.approx(b.truth[(9001, "gpu0")]) == pytest.approx(job_s * 300.0)
