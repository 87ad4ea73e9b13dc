"""A test bench for attribution: fake NVML GPUs (real dumps) behind the real NVML backend, simulated
processes with /proc files and psutil answers, and snapshots whose energy counters follow the power the
bench draws. Ground truth is computed here, second by second, independently of the accountant."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aithermd.accounting.attribution import IdleFloor
from aithermd.accounting.procs import ProcessTable, ProcReader
from aithermd.accounting.service import EnergyService
from aithermd.backends.nvml import NvmlBackend
from aithermd.model import Channel, Device, DeviceKind, Quantity, Reading, Snapshot
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.processes import SLURM_CGROUP, SimProcess, SimProcesses
from aithermd.sim.smi_dump import load_dump
from tests.support.clock import SimClock

DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi-q"
RTX4090 = DUMPS / "rtx4090-x8-nvidia-smi-q.txt"
FLOOR_W = 25.0


def _device(dev_id: str, kind: DeviceKind, info: dict) -> Device:
    return Device(dev_id, kind, dev_id, channels=(
        Channel(f"{dev_id}/power", dev_id, "power", Quantity.POWER, "W"),
        Channel(f"{dev_id}/energy", dev_id, "energy", Quantity.ENERGY, "J")), info=info)


@dataclass
class Bench:
    tmp: Path
    gpus: int = 2
    clock: SimClock = field(default_factory=SimClock)

    def __post_init__(self) -> None:
        self.nvml = FakeNvml([load_dump(RTX4090)[0]] * self.gpus)
        for g in self.nvml.gpus:
            g.processes.clear()
        self.procs = SimProcesses(self.tmp / "proc", self.nvml)
        self.counters = {f"gpu{i}": 0.0 for i in range(self.gpus)} | {"powercap:package-0": 0.0}
        self.power = {d: FLOOR_W for d in self.counters}
        self.util = {i: 0.0 for i in range(self.gpus)}
        self.truth: dict[tuple[int, str], float] = {}  # (pid, device) → J it should be charged
        self.devices = tuple(_device(f"gpu{i}", DeviceKind.GPU, {"uuid": self.nvml.gpu(i).uuid})
                             for i in range(self.gpus)) + (
            _device("powercap:package-0", DeviceKind.POWERCAP, {"zone": "package-0"}),)
        self.seq = 0
        self.backend: NvmlBackend | None = None
        self.service: EnergyService | None = None

    def start_daemon(self, state_dir: Path | None, boot_id: str | None = None) -> EnergyService:
        if self.backend is not None:
            self.backend.close()
        self.backend = NvmlBackend(nvml=self.nvml.bindings(), clock=self.clock)
        self.backend.discover()
        table = ProcessTable(psutil_module=self.procs, reader=ProcReader(self.tmp / "proc"))
        self.service = EnergyService(self.clock, state_dir, table=table, gpus=[self.backend],
                                     interval_s=float("inf"),
                                     **({} if boot_id is None else {"boot_id": boot_id}))
        for i in range(self.gpus):
            self.service.accountant.floors.setdefault(self.nvml.gpu(i).uuid, IdleFloor(FLOOR_W))
        self.service.on_publish(self.snapshot())
        return self.service

    def stop_daemon(self) -> None:
        self.service.stop()
        self.service = None

    def job(self, pid: int, job: int, gpus: dict[int, float], memory_mib: float = 8000.0) -> SimProcess:
        return self.procs.start(SimProcess(pid, "python", ["python", "train.py", f"--job={job}"],
                                           SLURM_CGROUP.format(job=job), uid=0, start_wall=self.clock.wall(),
                                           gpus={i: (memory_mib, w) for i, w in gpus.items()}))

    def snapshot(self) -> Snapshot:
        self.seq += 1
        readings = {}
        for dev, joules in self.counters.items():
            readings[f"{dev}/energy"] = Reading(f"{dev}/energy", joules)
            readings[f"{dev}/power"] = Reading(f"{dev}/power", self.power[dev])
        return Snapshot(self.seq, self.clock.monotonic(), self.clock.wall(), self.devices, readings)

    def second(self) -> None:
        """One second of load: counters, per-process samples and the ground truth of each GPU's shares."""
        self.clock.advance(1.0)
        self.procs.step(self.clock.wall(), 1.0, lambda i: self.util[i])
        for i in range(self.gpus):
            dev = f"gpu{i}"
            self.counters[dev] += self.power[dev]
            on = [p for p in self.procs.processes.values() if i in p.gpus]
            weights = {p.pid: p.gpus[i][1] for p in on}
            total = sum(weights.values())
            for p in on:
                share = (self.power[dev] - FLOOR_W) * weights[p.pid] / total + FLOOR_W / len(on)
                self.truth[(p.pid, dev)] = self.truth.get((p.pid, dev), 0.0) + share
        self.counters["powercap:package-0"] += self.power["powercap:package-0"]
        if self.service is not None:
            self.service.on_publish(self.snapshot())

    def run(self, seconds: int, every: int = 5) -> None:
        for s in range(1, seconds + 1):
            self.second()
            if self.service is not None and s % every == 0:
                self.account()

    def account(self) -> None:
        self.service.apply(self.backend.usage(), self.service.accountant.table.scan())
