"""Energy across time no accounting pass watched (attack8 T2, T3, T4, T8): a daemon downtime, a reboot, a
suspend, a bad counter sample. The tests' Bench (real NVML backend over the fake NVML, real EnergyService,
process table over a fake /proc) on the fake clock; units J, W, s."""

from __future__ import annotations

import pytest

from aithermd.accounting.meter import EnergyMeter
from aithermd.backends.nvml import NvmlBackend
from aithermd.model import Reading, Snapshot, Status
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.smi_dump import load_dump
from tests.accounting.bench import FLOOR_W, RTX4090, Bench
from tests.support.clock import SimClock

BOOT = "3f1c7b2e-0d7a-4c55-9a3e-5d0c2a1b9e01"


def _jobs(service) -> dict[str, float]:
    return {name: g.get("gpu0", 0.0) for name, g in service.processes_document()["groups"]["job"].items()}


def test_energy_used_while_the_daemon_was_down_is_charged_to_nobody(tmp_path):
    """Job A trains at 300 W through an hour of downtime and ends; job B runs 10 s after the restart. B is
    charged its own 10 s, the hour stays in the device total as unattributed (T2: B was charged 96.5 kJ); A's
    samples left in the driver's buffer take no share of B's (attack9 N5: B got 1,631 J, A's dead pid the
    other 1,369 J)."""
    state = tmp_path / "state"
    state.mkdir()
    b = Bench(tmp_path, gpus=1)
    b.job(7001, 301, {0: 1.0})
    b.util[0], b.power["gpu0"] = 100.0, 300.0
    b.start_daemon(state)  # this boot's id, read by the service
    b.run(60)
    b.stop_daemon()
    b.run(3600)  # the daemon is down; A runs on at 300 W, then ends
    b.procs.stop(7001)
    b.util[0], b.power["gpu0"] = 0.0, FLOOR_W
    b.run(30)
    down_j = 3600 * 300.0 + 30 * FLOOR_W
    service = b.start_daemon(state)
    b.job(7002, 302, {0: 1.0})
    b.util[0], b.power["gpu0"] = 100.0, 300.0
    b.run(10)
    assert _jobs(service)["slurm:302"] == pytest.approx(10 * 300.0)
    assert [p["pid"] for p in service.processes_document()["processes"]] == [7002]
    ledger = service.accountant.ledger.devices["gpu0"]
    assert ledger["unattributed_j"] == pytest.approx(down_j)
    assert ledger["total_j"] == pytest.approx(down_j + 10 * 300.0)  # this run's device total keeps it all
    day = next(iter(service.history.days.values()))
    assert day["unattributed"]["gpu0"] == pytest.approx(down_j)


def test_a_counter_reading_of_another_boot_counts_nothing(tmp_path):
    """After a reboot the GPU's counter restarted at 0 and has passed the saved value: the difference is no
    energy (the saved point carries its boot id and is dropped)."""
    state = tmp_path / "state"
    state.mkdir()
    b = Bench(tmp_path, gpus=1)
    b.start_daemon(state, boot_id=BOOT)
    b.run(10)
    saved = b.counters["gpu0"]
    b.stop_daemon()
    b.clock.advance(600.0)
    b.counters["gpu0"] = 3 * saved  # restarted at 0 with the reboot, then counted past the saved value
    service = b.start_daemon(state, boot_id="another-boot")
    b.run(5)
    ledger = service.accountant.ledger.devices["gpu0"]
    assert ledger["unattributed_j"] == 0.0
    assert ledger["total_j"] == pytest.approx(5 * FLOOR_W)


@pytest.mark.parametrize("rebooted", [True, False])
def test_with_the_boot_id_unreadable_only_the_boot_clock_keeps_a_counter_point(tmp_path, rebooted):
    """The boot id reads "" (a sandbox masking /proc/sys). The daemon runs 60 s at 300 W and stops; it
    starts again after 400 s at 300 W. Rebooted 30 s after the stop, the machine idle 1,100 s before those
    400 s (the boot clock and the counter started again at 0 and passed the saved point's): the saved point
    is no measure, nothing of the downtime counts (attack9 N6: the counter's 79.5 kJ past it booked). Not
    rebooted (the boot clock went on with the wall clock): the downtime is the counter's increase,
    unattributed, as with the boot id read."""
    state = tmp_path / "state"
    state.mkdir()
    b = Bench(tmp_path, gpus=1)
    b.job(7001, 301, {0: 1.0})  # trains through it all: the daemon's 70 s are its
    b.power["gpu0"], b.util[0] = 300.0, 100.0
    b.counters["gpu0"] = 50_000.0  # J: counted since boot
    b.start_daemon(state, boot_id="")
    b.run(60)
    b.stop_daemon()
    assert b.clock.boottime() == 1060.0  # s: the point's boot clock
    if rebooted:  # booted 30 s after the stop; the boot clock (1,100 s) and counter now
        b.clock = SimClock(start=1100.0, wall_start=b.clock.wall() + 30.0 + 1100.0)
        b.counters["gpu0"] = 1100 * FLOOR_W
    b.run(400)
    service = b.start_daemon(state, boot_id="")
    b.run(10)
    ledger = service.accountant.ledger.devices["gpu0"]
    down_j = 0.0 if rebooted else 400 * 300.0
    assert ledger["unattributed_j"] == pytest.approx(down_j)
    assert ledger["total_j"] == pytest.approx(down_j + 10 * 300.0)


def test_a_suspend_teaches_the_idle_floor_nothing(tmp_path):
    """An hour asleep with the GPU in D3 (its counter still): the interval's mean draw (~0 W) is no idle
    draw; the next idle minutes stay idle, not unattributed (T4: the floor fell to 0.03 W, 92 % of the
    idle energy went unattributed)."""
    b = Bench(tmp_path, gpus=1)
    service = b.start_daemon(None)
    floor = service.accountant.floors[b.nvml.gpu(0).uuid]
    b.run(60)
    b.clock.suspend(3600.0)
    b.run(5)
    assert floor.value == pytest.approx(FLOOR_W)
    before = dict(service.accountant.ledger.devices["gpu0"])
    b.run(600)
    after = service.accountant.ledger.devices["gpu0"]
    assert after["idle_j"] - before["idle_j"] == pytest.approx(600 * FLOOR_W)
    assert after["unattributed_j"] == before["unattributed_j"]
    b.run(600)  # awake again: idle intervals still teach it
    b.power["gpu0"] = FLOOR_W / 2
    b.run(10)
    assert floor.value == pytest.approx(FLOOR_W / 2)


def test_a_bad_sample_is_estimated_from_the_last_measured_rate(tmp_path):
    """A pre-Volta GPU's energy is integrated from its power samples: one 10× power sample breaks the
    meter's ceiling, and its estimate must not come from that same reading (T3: it did, uncapped)."""
    b = Bench(tmp_path, gpus=1)
    b.start_daemon(None)
    devices = tuple(b.backend.discover())
    meter = EnergyMeter(clock=b.clock)

    def feed(joules: float, watts: float) -> float:
        b.clock.advance(1.0)
        readings = {"gpu0/energy": Reading("gpu0/energy", joules), "gpu0/power": Reading("gpu0/power", watts)}
        return meter.feed(Snapshot(0, b.clock.monotonic(), b.clock.wall(), devices, readings)).joules["gpu0"]

    feed(0.0, 250.0)
    assert feed(250.0, 250.0) == pytest.approx(250.0)
    assert feed(250.0 + 25_000.0, 25_000.0) == pytest.approx(250.0)  # the last measured 250 W, not 25 kW
    assert feed(100.0, 20_000.0) <= 2 * 450.0  # gone back: the power now, never over the ceiling (2 × 450 W)


def test_nvml_energy_through_a_suspend_with_the_gpu_powered_is_kept():
    """s2idle with the GPU kept in D0 at 20 W for an hour: the counter's 72 kJ are judged on the boot clock
    (T8: on the monotonic one they were "72 kW", dropped as garbage)."""
    clock = SimClock()
    nv = FakeNvml([load_dump(RTX4090)[0]])
    backend = NvmlBackend(nvml=nv.bindings(), clock=clock)
    backend.discover()

    def step(seconds: float, asleep: bool = False) -> Reading:
        (clock.suspend if asleep else clock.advance)(seconds)
        nv.add_energy(0, 20.0 * seconds, seconds)  # J: 20 W
        return backend.sample().readings["gpu0/energy"]

    first = step(1.0)
    step(1.0)
    step(3600.0, asleep=True)
    last = step(1.0)
    assert last.status is Status.OK
    assert last.value - first.value == pytest.approx(20.0 * 3602)
