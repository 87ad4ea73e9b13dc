"""One garbage NVML energy reading (the counter + 2**40 mJ, once; attack4 B1) through the real NVML backend
over the fake NVML, the daemon's sensor trust and the energy service: no device, job, window or day total
takes it, and neither the raw exported counter nor the accounting's counter ever jumps; a counter re-based
ahead for good is re-anchored, the interval up to it estimated from power."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aithermd.accounting.attribution import IdleFloor
from aithermd.accounting.procs import ProcessTable, ProcReader
from aithermd.accounting.service import EnergyService
from aithermd.backends.nvml import NvmlBackend
from aithermd.model import Snapshot, Status
from aithermd.publish import metrics
from aithermd.publish.energy_metrics import EnergyCollector
from aithermd.publish.hub import StateHub
from aithermd.runtime.health import Health
from tests.accounting.bench import FLOOR_W, Bench

GARBAGE_MJ = 2**40
POWER_W = 400.0


class Daemon:
    """The fake NVML's RTX 4090 drawing POWER_W for one Slurm job, read each second by the real backend."""

    def __init__(self, tmp_path) -> None:
        self.bench = bench = Bench(tmp_path, gpus=1)
        self.fake = bench.nvml
        self.backend = NvmlBackend(nvml=self.fake.bindings(), clock=bench.clock)
        self.devices = tuple(self.backend.discover())
        table = ProcessTable(psutil_module=bench.procs, reader=ProcReader(tmp_path / "proc"))
        self.service = EnergyService(bench.clock, None, table=table, gpus=[self.backend],
                                     interval_s=math.inf)
        self.service.accountant.floors.setdefault(self.fake.gpu(0).uuid, IdleFloor(FLOOR_W))
        self.health, self.hub, self.seq = Health(), StateHub(), 0
        bench.job(5001, 101, {0: 1.0})
        bench.util[0] = 100.0
        self.fake.set_dynamic(0, power_draw_w=POWER_W)
        self.raw: list[float | None] = []  # the raw exported counter at each tick
        self.publish()

    def publish(self) -> Snapshot:
        clock = self.bench.clock
        sample = self.backend.sample()
        readings = self.health.trust(self.devices, sample.t, sample.readings)
        self.seq += 1
        snap = Snapshot(self.seq, clock.monotonic(), clock.wall(), self.devices, readings)
        self.hub.publish(snap)
        self.service.on_publish(snap)
        self.raw.append(_scrape(metrics.SnapshotCollector(self.hub, metrics.EventCounters(), "gpu"))
                        .get("aithermd_gpu_energy_joules_total"))
        return snap

    def second(self, garbage_mj: int = 0) -> Snapshot:
        clock = self.bench.clock
        clock.advance(1.0)
        self.bench.procs.step(clock.wall(), 1.0, lambda i: self.bench.util[i])
        self.fake.add_energy(0, POWER_W, 1.0)  # the card's own counter, in mJ
        self.fake.gpus[0].energy_mj += garbage_mj
        try:
            return self.publish()
        finally:
            self.fake.gpus[0].energy_mj -= garbage_mj

    def account(self) -> None:
        self.service.apply(self.backend.usage(), self.service.accountant.table.scan())


def _scrape(collector) -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
            for s in f.samples}


def _monotonic_by_at_most(values, most: float) -> None:
    got = [v for v in values if v is not None]
    steps = [b - a for a, b in zip(got, got[1:], strict=False)]
    assert steps and min(steps) >= 0.0 and max(steps) <= most, steps


def test_one_garbage_energy_reading_is_not_counted_anywhere(tmp_path):
    d = Daemon(tmp_path)
    window = d.service.windows.start("job", 0.0, uid=0, scope="job:101")
    for s in range(1, 21):
        snap = d.second(GARBAGE_MJ if s == 10 else 0)
        if s == 10:  # the bad sample: not ok, whatever the trust makes of it (held at the last good value)
            r = snap.readings["gpu0/energy"]
            assert r.status is not Status.OK or "held" in (r.detail or "")
        if s % 5 == 0:
            d.account()
    real = 20 * POWER_W  # the counter's own increase: the good read after the bad one covers the gap
    ledger = d.service.accountant.ledger
    assert ledger.devices["gpu0"]["total_j"] == pytest.approx(real)
    job = d.service.processes_document()["groups"]["job"]["slurm:101"]["gpu0"]
    assert job == pytest.approx(real)
    doc = d.service.windows.stop(window, uid=0, name="job")
    assert doc["joules"]["gpu0"] == pytest.approx(real)
    rows = {r["name"]: r for r in d.service.report(0.0, "job")["rows"]}
    assert rows["slurm:101"]["joules"]["gpu0"] == pytest.approx(real)
    exported = _scrape(EnergyCollector(lambda: d.service.exporter.export))
    assert exported["aithermd_energy_joules_total"] == pytest.approx(real)
    _monotonic_by_at_most(d.raw, 2 * POWER_W)  # the raw NVML counter: never up by the garbage, never back
    assert d.raw[-1] == pytest.approx(d.raw[0] + real)


def test_a_counter_re_based_ahead_is_re_anchored_from_power(tmp_path):
    d = Daemon(tmp_path)
    for s in range(1, 21):
        if s == 10:
            d.fake.gpus[0].energy_mj += GARBAGE_MJ  # for good: a counter re-based ahead (driver reload)
        d.second()
        if s % 5 == 0:
            d.account()
    # 1 s before the first bad read estimated from power (400 W), the rest measured: nothing lost
    assert d.service.accountant.ledger.devices["gpu0"]["total_j"] == pytest.approx(20 * POWER_W)
    _monotonic_by_at_most(d.raw, 2 * POWER_W)
    assert d.raw[-1] == pytest.approx(d.raw[0] + 20 * POWER_W)


def test_the_meter_estimates_an_increase_no_device_can_make(tmp_path):
    """The meter's own last line (a backend without the guard, a point given back after a restart): an
    increase over 2 × the device's maximum power limit is estimated from its power, like a reset."""
    from aithermd.accounting.meter import EnergyMeter
    from aithermd.backends.energy_rate import MAX_PLAUSIBLE_W, POWER_MARGIN, ceiling_w, device_ceiling_w
    from aithermd.model import Reading

    d = Daemon(tmp_path)
    (gpu,) = d.devices
    top = max(k.max for k in gpu.knobs if k.kind == "power_limit")
    assert device_ceiling_w(gpu) == POWER_MARGIN * top and ceiling_w(None) == MAX_PLAUSIBLE_W
    meter = EnergyMeter()

    def feed(t: float, joules: float) -> dict[str, float]:
        readings = {"gpu0/energy": Reading("gpu0/energy", joules), "gpu0/power": Reading("gpu0/power", 300.0)}
        return meter.feed(Snapshot(0, 1000.0 + t, 5e8 + t, d.devices, readings)).joules

    feed(0.0, 100.0)
    assert feed(2.0, 100.0 + 2 * POWER_MARGIN * top) == {"gpu0": pytest.approx(2 * POWER_MARGIN * top)}
    assert feed(3.0, 1e12) == {"gpu0": pytest.approx(300.0)}  # garbage: 1 s at 300 W instead


def test_a_package_drawing_over_twice_its_pl_maximum_is_counted_not_taken_for_garbage(tmp_path):
    """attack5 C8: RAPL's constraint maximum (about the TDP: 125 W here) bounds no draw -- PL2 and an
    "unlimited" board let a package draw 300 W for minutes. Its increases were held to 2 × 250 W, so a read
    gap of a minute at 300 W became garbage and a third of the energy was estimated away."""
    from aithermd.accounting.meter import EnergyMeter
    from aithermd.backends.energy_rate import MAX_PLAUSIBLE_W, device_ceiling_w
    from aithermd.model import Channel, Device, Quantity, Reading
    from tests.policy.machines import PKG, rapl

    bare = rapl()
    zone = Device(bare.id, bare.kind, bare.name,
                  (*bare.channels, Channel(f"{PKG}/energy", PKG, "energy", Quantity.ENERGY, "J")), bare.knobs)
    assert device_ceiling_w(zone) == MAX_PLAUSIBLE_W
    meter = EnergyMeter()

    def feed(t: float, joules: float) -> dict[str, float]:
        readings = {f"{PKG}/energy": Reading(f"{PKG}/energy", joules),
                    f"{PKG}/power": Reading(f"{PKG}/power", 300.0)}
        return meter.feed(Snapshot(0, 1000.0 + t, 5e8 + t, (zone,), readings)).joules

    feed(0.0, 0.0)
    assert feed(2.0, 1200.0) == {PKG: pytest.approx(1200.0)}  # 600 W for 2 s: over 2 × 250 W, a real draw
