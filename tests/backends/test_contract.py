"""Every backend keeps the contract of :mod:`tests.support.backend_contract`: the real ones on every recorded
tree (hwmon on the six machines and two exporter trees, the inline and slow hwmon lanes, thermal zones,
powercap on two RAPL trees, cpu on this machine's psutil, the CPU's knobs on the recorded intel_pstate tree,
the hwmon GPUs on the three recorded amdgpu cards, NVML over the fake NVML from recorded dumps,
privileged and not) and the fakes the other tests drive the daemon with (:mod:`tests.support.fake_backend`)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil
import pynvml
import pytest

from aithermd.backends.cpu import CpuBackend
from aithermd.backends.cpu_knobs import CpuKnobBackend
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.hwmon_subset import HwmonSubset
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.powercap import RaplBackend
from aithermd.backends.slow import SlowBackend, SlowOptions
from aithermd.backends.thermal import ThermalBackend
from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.smi_dump import load_dump
from tests.support import backend_contract as contract
from tests.support.backend_contract import Rig
from tests.support.clock import SimClock
from tests.support.fake_backend import FakeBackend, ScriptedSensor
from tests.support.machines import MACHINES, NVIDIA_SMI, Z690, copy_machine

from .faults import FaultIO

HWMON_TREES = ["node-exporter-sys-hwmon-thermal-powercap.ttar", "telegraf-temp-hwmon-with-device-sysfs.ttar"]
RAPL_TREES = ["node-exporter-sys-class-powercap-intel-rapl.ttar",
              "prometheus-procfs-sys-class-powercap-intel-rapl.ttar"]
NO_PWM = {Z690, "supermicro-as-4124gs-tnr-gpu-server-amd-energy-nvme-i350"}  # machines without a pwm knob
GPU_DUMPS = [NVIDIA_SMI / "rtx4090-x8-nvidia-smi-q.txt",  # the first of its eight RTX 4090s
             NVIDIA_SMI / "h100-80gb-hbm3-nvidia-smi-q-idle-and-load.txt"]


def _eio() -> OSError:
    return OSError(errno.EIO, "Input/output error")


def _enodev() -> OSError:
    return OSError(errno.ENODEV, "No such device")


def _fail_reads(io: FaultIO) -> None:
    io.faults[""] = [_eio()]


def _lose(io: FaultIO) -> None:
    """Every file of the tree is gone: reads, opens and writes answer ENODEV, as sysfs does after unbind."""
    io.faults[""] = [_enodev()]
    io.open_faults[""] = [_enodev()]
    io.write_faults[""] = _enodev()


def sysfs_rig(tmp_path: Path, tree: str, make: Callable[[str, FaultIO, SimClock], object]) -> Rig:
    root, io, clock = str(copy_machine(tmp_path, tree)), FaultIO(), SimClock()
    return Rig(make=lambda: make(root, io, clock), fail_reads=partial(_fail_reads, io),
               lose=partial(_lose, io), before_sample=lambda backend: clock.advance(1.0))


def cpu_knobs(managed_by: list[str]) -> Callable[[Path], Rig]:
    """The recorded intel_pstate tree with EPP, no_turbo and platform_profile added (test_cpu_knobs)."""
    def build(tmp: Path) -> Rig:
        from tests.backends.test_cpu_knobs import with_epp

        root, io = str(with_epp(tmp)), FaultIO()
        return Rig(make=lambda: CpuKnobBackend(root, io=io, managed_by=managed_by),
                   fail_reads=partial(_fail_reads, io), lose=partial(_lose, io), reopens=not managed_by)
    return build


def hwmon_gpu(card: str) -> Callable[[Path], Rig]:
    """An amdgpu card from its recorded tree (test_gpu_hwmon), as the hwmon GPU backend reads it."""
    def build(tmp: Path) -> Rig:
        from aithermd.backends.gpu_hwmon import HwmonGpuBackend
        from tests.backends.test_gpu_hwmon import tree

        root, io, clock = str(tree(tmp, card)), FaultIO(), SimClock()
        return Rig(make=lambda: HwmonGpuBackend(root, io=io, clock=clock), fail_reads=partial(_fail_reads, io),
                   lose=partial(_lose, io), before_sample=lambda backend: clock.advance(1.0))
    return build


def hwmon(tree: str) -> Callable[[Path], Rig]:
    return lambda tmp: sysfs_rig(tmp, tree, lambda root, io, clock: HwmonBackend(root, io=io, clock=clock))


def hwmon_inline(tmp: Path) -> Rig:
    return sysfs_rig(tmp, Z690, lambda root, io, clock: HwmonSubset(root, keep="except", io=io, clock=clock))


def rapl(tree: str) -> Callable[[Path], Rig]:
    return lambda tmp: sysfs_rig(tmp, tree, lambda root, io, clock: RaplBackend(root, clock=clock, io=io))


def thermal(tree: str) -> Callable[[Path], Rig]:
    return lambda tmp: sysfs_rig(tmp, tree, lambda root, io, clock: ThermalBackend(root, io=io, clock=clock))


def slow_lane(tmp: Path) -> Rig:
    """The nvme chip of the Z690 board in its own lane; its reader thread's read is run in line."""
    root, io, clock = str(copy_machine(tmp, Z690)), FaultIO(), SimClock()
    inner = partial(HwmonSubset, root, drivers=("nvme",), keep="only", io=io, clock=clock)

    def read(backend: SlowBackend) -> None:
        clock.advance(1.0)
        if backend.reader is not None:
            backend.reader.read_once()

    def make() -> SlowBackend:
        return SlowBackend(inner, SlowOptions(first_wait_s=0.0), clock, name="nvme", start=False)

    return Rig(make=make, fail_reads=partial(_fail_reads, io), lose=partial(_lose, io), before_sample=read)


class _Psutil:
    """This machine's psutil until ``failing``: then every call raises EIO (an unreadable /proc)."""

    def __init__(self) -> None:
        self.failing = False

    def __getattr__(self, name: str):
        real = getattr(psutil, name)
        if not self.failing or not callable(real):
            return real

        def fail(*args, **kwargs):
            raise _eio()

        return fail


def cpu(tmp: Path) -> Rig:
    ps, clock = _Psutil(), SimClock()

    def fail() -> None:
        ps.failing = True

    return Rig(make=lambda: CpuBackend(psutil_module=ps, clock=clock), fail_reads=fail, lose=None)


def nvml(*, privileged: bool) -> Callable[[Path], Rig]:
    """An RTX 4090 with two fans and a passive H100 from their nvidia-smi -q dumps, behind the fake NVML
    (its state file lets ``aithermd restore`` rebuild the backend from the locator)."""

    def build(tmp: Path) -> Rig:
        gpus = [load_dump(path)[0] for path in GPU_DUMPS]
        fake = FakeNvml(gpus, fan_count=[2, None], privileged=privileged, state_path=tmp / "nvml-state.json")
        clock = SimClock()

        def lose() -> None:
            for index in range(len(fake.gpus)):
                fake.lose_gpu(index)

        return Rig(make=lambda: NvmlBackend(nvml=fake.bindings(), clock=clock),
                   fail_reads=lambda: fake.inject("*", None, pynvml.NVML_ERROR_UNKNOWN), lose=lose)

    return build


def fake_backend(tmp: Path) -> Rig:
    """The daemon tests' board. Its state lives in the instance: the levers act on every instance made."""
    made: list[FakeBackend] = []

    def make() -> FakeBackend:
        made.append(FakeBackend("board"))
        return made[-1]

    def fail() -> None:
        for b in made:
            b.fail_all_reads()

    def lose() -> None:
        for b in made:
            b.lost = True

    return Rig(make=make, fail_reads=fail, lose=lose, reopens=False)


def scripted_sensor(tmp: Path) -> Rig:
    """The slow-lane tests' nvme drive."""
    clock = SimClock()
    made: list[ScriptedSensor] = []

    def make() -> ScriptedSensor:
        made.append(ScriptedSensor(clock))
        return made[-1]

    def fail() -> None:
        for s in made:
            s.fail_reads()

    return Rig(make=make, fail_reads=fail, lose=None, reopens=False)


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Rig]
    knobs: bool = False  # it has writable knobs to exercise
    read_only: bool = False  # it has read-only knobs
    loses: bool = True  # its devices can vanish


CASES: dict[str, Case] = {
    **{f"hwmon:{m}": Case(hwmon(m), knobs=m not in NO_PWM) for m in MACHINES},
    **{f"hwmon:{t.removesuffix('.ttar')}": Case(hwmon(t)) for t in HWMON_TREES},
    "hwmon-inline:z690": Case(hwmon_inline),
    "thermal:node-exporter-sys-hwmon-thermal-powercap": Case(thermal(HWMON_TREES[0])),
    "slow:z690-nvme": Case(slow_lane),
    **{f"powercap:{t.removesuffix('.ttar')}": Case(rapl(t), knobs=True) for t in RAPL_TREES},
    "cpu:psutil": Case(cpu, loses=False),
    "cpuknobs:procfs-intel-pstate-epp": Case(cpu_knobs([]), knobs=True),
    **{f"hwmon-gpu:{card}": Case(hwmon_gpu(card), knobs=True) for card in ("rx6900xt", "rx7900xtx")},
    "hwmon-gpu:rx9070xt": Case(hwmon_gpu("rx9070xt"), knobs=True, read_only=True),  # firmware-owned fan
    "cpuknobs:power-profiles-daemon": Case(cpu_knobs(["power-profiles-daemon"]), read_only=True),
    "nvml:fake-4090-h100": Case(nvml(privileged=True), knobs=True),
    "nvml:fake-4090-h100-unprivileged": Case(nvml(privileged=False), read_only=True),
    "fake:FakeBackend": Case(fake_backend, knobs=True),
    "fake:ScriptedSensor": Case(scripted_sensor, loses=False),
}


def _names(flag: str | None = None) -> list[str]:
    return sorted(n for n, c in CASES.items() if flag is None or getattr(c, flag))


@pytest.fixture
def rig(request, tmp_path):
    built = CASES[request.param].build(tmp_path)
    yield built
    built.close()


def cases(flag: str | None = None):
    return pytest.mark.parametrize("rig", _names(flag), indirect=True)


@cases()
def test_discovery_describes_every_device_in_daemon_units(rig):
    contract.check_devices(rig.open().discover())


@cases()
def test_ids_are_stable_across_rediscovery_and_restart(rig):
    contract.check_stable_ids(rig)


@cases()
def test_every_sample_reads_every_channel_and_knob(rig):
    backend = rig.open()
    devices = backend.discover()
    for _ in range(3):
        contract.check_sample(devices, rig.sample(backend))


@cases()
def test_failing_reads_become_statuses_never_exceptions(rig):
    contract.check_read_failures(rig)


@cases("loses")
def test_vanished_devices_are_lost_and_refuse_writes(rig):
    contract.check_loss(rig)


@cases("knobs")
def test_knobs_write_in_range_refuse_out_of_range_and_restore(rig):
    contract.check_knobs(rig)


@cases("read_only")
def test_read_only_knobs_refuse_writes(rig):
    contract.check_read_only_knobs(rig)


@cases()
def test_unknown_knob_ids_raise_unknown_knob(rig):
    contract.check_unknown_knob(rig)


@cases()
def test_locator_is_json_and_rebuilds_every_knob(rig):
    contract.check_locator(rig)


@cases()
def test_close_twice(rig):
    contract.check_close_twice(rig)


def test_every_backend_family_and_fake_is_held_to_the_contract():
    families = {name.split(":", 1)[0] for name in CASES}
    assert families == {"hwmon", "hwmon-inline", "hwmon-gpu", "slow", "powercap", "thermal", "cpu", "cpuknobs",
                        "nvml", "fake"}
    assert len([n for n in CASES if n.startswith("hwmon:")]) == len(MACHINES) + len(HWMON_TREES)
