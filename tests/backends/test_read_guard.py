"""The read guard: a hung read quarantines its device, the others read on, and it is read again once the
read returns (recorded X570 board through the I/O seam; a read that blocks on an event)."""

from __future__ import annotations

import asyncio
import threading
import time

from aithermd.backends.guard import ReadGuard
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.thermal import ThermalBackend
from aithermd.model import Reading, Sample, Status
from aithermd.sim import ttar

from .faults import FaultIO
from .helpers import MACHINES_DIR, TTAR

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT = "hwmon:nct6798-isa-0290"
K10 = "hwmon:k10temp-pci-00c3"


class HangingIO(FaultIO):
    """Reads of a file ending in ``hang_suffix`` block until ``release`` is set."""

    def __init__(self, hang_suffix: str) -> None:
        super().__init__()
        self.hang_suffix, self.armed, self.release = hang_suffix, False, threading.Event()

    def pread(self, fd: int, size: int) -> bytes:
        if self.armed and self._paths.get(fd, "").endswith(self.hang_suffix):
            self.release.wait(30)
        return super().pread(fd, size)


def passes(guard, backends, n):
    channels = {id(b): [c.id for d in b.discover() for c in d.channels] for b in backends}

    async def go():
        out = []
        for _ in range(n):
            out.append(await guard.sample(backends, lambda b: b.sample(), lambda b: channels[id(b)],
                                          time.monotonic))
        return out
    return channels, go


def test_a_hung_read_quarantines_its_chip_and_the_rest_reads_on(tmp_path):
    io = HangingIO("hwmon1/temp1_input")  # nct6798 SYSTIN
    hwmon = HwmonBackend(str(X570), io=io)
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
    zones = ThermalBackend(str(tmp_path / "fixtures" / "sys"))
    guard = ReadGuard(deadline_s=0.2)
    _, go = passes(guard, [hwmon, zones], 1)
    try:
        (first,) = asyncio.run(go())
        assert first[0].readings[f"{NCT}/temp1"].value == 28.0
        io.armed = True
        (cut,) = asyncio.run(go())  # the pass hangs in the nct6798: cut short after 0.2 s
        assert guard.hangs == 1 and hwmon.skip == {NCT: "read hung: no answer within 0.2 s"}
        assert cut[0].readings[f"{NCT}/temp1"].status == Status.STALE
        # the rest of the pass went on at this tick on a new thread: the chips after it, the zones
        assert cut[0].readings[f"{K10}/temp1"].value == 32.6
        assert cut[1].readings["thermal:acpitz/temp"].value == -44.0
        (after,) = asyncio.run(go())  # a new thread: the nct6798 skipped, everything else read
        assert after[0].readings[f"{NCT}/temp1"].status == Status.STALE
        assert after[0].readings[f"{NCT}/fan1"].status == Status.STALE
        assert after[0].readings[f"{K10}/temp1"].value == 32.6
        assert after[1].readings["thermal:acpitz/temp"].value == -44.0
        io.release.set()  # the hung read returns: the chip is read again
        for _ in range(100):
            if not hwmon.skip:
                break
            time.sleep(0.02)
        (back,) = asyncio.run(go())
        assert back[0].readings[f"{NCT}/temp1"].value == 28.0
    finally:
        io.release.set()
        guard.close()
        hwmon.close()
        zones.close()


def test_one_hung_zone_never_blanks_the_others(tmp_path):
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
    io = HangingIO("thermal_zone0/temp")
    zones = ThermalBackend(str(tmp_path / "fixtures" / "sys"), io=io)
    guard = ReadGuard(deadline_s=0.2)
    _, go = passes(guard, [zones], 1)
    try:
        asyncio.run(go())
        io.armed = True
        asyncio.run(go())
        (later,) = asyncio.run(go())
        assert later[0].readings["thermal:bcm2835_thermal/temp"].status == Status.STALE
        assert later[0].readings["thermal:acpitz/temp"].value == -44.0
    finally:
        io.release.set()
        guard.close()
        zones.close()


class Gated:
    """A backend without Quarantine whose sample waits for ``gate`` (a threaded one: NVML guards its own
    calls, and gets a budget of its own in the pass)."""

    kind = "nvml"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def sample(self):
        self.gate.wait(30)
        return Sample(0.0, {"gpu0/temperature": Reading("gpu0/temperature", 50.0)})


def test_a_backend_with_a_budget_of_its_own_is_waited_for_past_the_pass_deadline(tmp_path):
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
    zones = ThermalBackend(str(tmp_path / "fixtures" / "sys"))
    gpu = Gated()
    guard = ReadGuard(deadline_s=0.05)
    chans = {id(zones): [c.id for d in zones.discover() for c in d.channels], id(gpu): ["gpu0/temperature"]}

    def one(budget_s):
        return asyncio.run(guard.sample([zones, gpu], lambda b: b.sample(), lambda b: chans[id(b)],
                                        time.monotonic, lambda b: budget_s if b is gpu else None))
    try:
        gpu.gate.clear()
        threading.Timer(0.3, gpu.gate.set).start()  # slower than the pass's deadline, within the budget
        zone, read = one(30.0)
        assert read.readings["gpu0/temperature"].value == 50.0 and guard.hangs == 0
        assert zone.readings["thermal:acpitz/temp"].value == -44.0
        gpu.gate.clear()  # now past its budget: held whole until its sample returns, the zones read on
        _, cut = one(0.1)
        assert guard.hangs == 1 and cut.readings["gpu0/temperature"].status == Status.STALE
        zone, held = one(0.1)
        assert held.readings["gpu0/temperature"].status == Status.STALE and guard.hangs == 1
        assert zone.readings["thermal:acpitz/temp"].value == -44.0
        gpu.gate.set()
        for _ in range(100):
            if not guard._busy:
                break
            time.sleep(0.02)
        _, back = one(30.0)
        assert back.readings["gpu0/temperature"].value == 50.0
    finally:
        gpu.gate.set()
        guard.close()
        zones.close()
