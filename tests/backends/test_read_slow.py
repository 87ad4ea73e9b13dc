"""A slow chip (attack10 R1): reads that answer, but only after the read guard's deadline (an i2c or EC chip,
drivetemp waking a disk). Each device has a deadline of its own: the devices read after the slow one are
read on time at every tick, the slow one is quarantined (its channels stale) and, once it overran at each of
its last passes, held for a back-off instead of being read, and the tick held up, again at every tick. Read
in time after its back-off, it is back in service.

The slow read here blocks on an event that the test sets once the guard gave up on it: slower than the
deadline, without a wall-clock figure in the test. The back-off runs on a fake clock."""

from __future__ import annotations

import asyncio
import threading
import time

from structlog.testing import capture_logs

from aithermd.backends.guard import ReadGuard
from aithermd.backends.hangs import BACKOFF_S, HUNG_PASSES
from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.thermal import ThermalBackend
from aithermd.model import Reading, Sample, Status
from aithermd.sim import ttar

from .faults import FaultIO
from .helpers import MACHINES_DIR, TTAR

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT = "hwmon:nct6798-isa-0290"  # read before the k10temp
K10 = "hwmon:k10temp-pci-00c3"
SLOW_FILE = "hwmon1/temp1_input"  # nct6798 SYSTIN


class SlowIO(FaultIO):
    """While ``slow``, a read of a file ending in ``suffix`` answers only once ``answer`` is set (the test
    sets it after the pass: later than the deadline, whatever it is)."""

    def __init__(self, suffix: str) -> None:
        super().__init__()
        self.suffix, self.slow, self.answer = suffix, False, threading.Event()

    def pread(self, fd: int, size: int) -> bytes:
        if self.slow and self._paths.get(fd, "").endswith(self.suffix):
            self.answer.wait(30)
        return super().pread(fd, size)


def until(test, what: str) -> None:
    for _ in range(1000):
        if test():
            return
        time.sleep(0.005)
    raise AssertionError(f"never: {what}")


class Rig:
    def __init__(self, tmp_path) -> None:
        self.io = SlowIO(SLOW_FILE)
        self.hwmon = HwmonBackend(str(X570), io=self.io)
        ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
        self.zones = ThermalBackend(str(tmp_path / "fixtures" / "sys"))
        self.now = [1000.0]
        self.guard = ReadGuard(deadline_s=0.1, clock=lambda: self.now[0])
        self.backends = [self.hwmon, self.zones]
        self.chans = {id(b): [c.id for d in b.discover() for c in d.channels] for b in self.backends}
        self.slow_reads = lambda: sum(n for p, n in self.io.reads.items() if p.endswith(SLOW_FILE))

    def tick(self) -> dict[str, Reading]:
        got = asyncio.run(self.guard.sample(self.backends, lambda b: b.sample(), lambda b: self.chans[id(b)],
                                            time.monotonic))
        return {**got[0].readings, **got[1].readings}

    def returned(self) -> None:
        """Let the slow read the guard gave up on answer, and wait until it is dealt with."""
        self.io.answer.set()
        until(lambda: self.hwmon.skip.get(NCT, "").startswith("read hung") is False, "the read returned")
        self.io.answer.clear()

    def close(self) -> None:
        self.io.slow = False
        self.io.answer.set()
        self.guard.close()
        self.hwmon.close()
        self.zones.close()


def read_in_time(r: dict[str, Reading]) -> None:
    """The devices read after the slow chip, and the other backend, are read at this tick."""
    assert r[f"{K10}/temp1"].status == Status.OK and r[f"{K10}/temp1"].value == 32.6
    assert r["thermal:acpitz/temp"].value == -44.0


def test_a_slow_chip_never_blinds_the_devices_after_it_and_backs_off(tmp_path):
    rig = Rig(tmp_path)
    try:
        assert rig.tick()[f"{NCT}/temp1"].value == 28.0
        rig.io.slow = True
        for n in range(1, HUNG_PASSES + 1):
            r = rig.tick()
            read_in_time(r)
            assert r[f"{NCT}/temp1"].status == Status.STALE and rig.guard.hangs == n
            rig.returned()
            if n < HUNG_PASSES:
                assert NCT not in rig.hwmon.skip  # released: read again at the next pass
        # it overran at each of its last passes: held for a back-off, not read (nor waited for) each tick
        assert rig.hwmon.skip[NCT].startswith("read slow")
        reads = rig.slow_reads()
        for _ in range(3):
            r = rig.tick()
            read_in_time(r)
            assert r[f"{NCT}/temp1"].status == Status.STALE and r[f"{NCT}/fan1"].status == Status.STALE
        assert rig.slow_reads() == reads and rig.guard.hangs == HUNG_PASSES
        rig.io.slow = False  # fast again, but held until its back-off is over
        assert rig.tick()[f"{NCT}/temp1"].status == Status.STALE
        rig.now[0] += BACKOFF_S
        r = rig.tick()  # read again, in time: back in service
        assert r[f"{NCT}/temp1"].value == 28.0 and r[f"{NCT}/fan1"].status == Status.OK
        read_in_time(r)
        assert not rig.hwmon.skip and rig.guard.hangs == HUNG_PASSES
        rig.io.slow = True  # its history was forgotten: one overrun is one quarantine, then read again
        read_in_time(rig.tick())
        rig.returned()
        assert NCT not in rig.hwmon.skip
    finally:
        rig.close()


def test_the_back_off_grows_while_the_chip_stays_slow(tmp_path):
    rig = Rig(tmp_path)
    try:
        rig.io.slow = True
        for _ in range(HUNG_PASSES):
            read_in_time(rig.tick())
            rig.returned()
        assert rig.hwmon.skip[NCT].endswith(f"read again in {BACKOFF_S:g} s")
        rig.now[0] += BACKOFF_S - 0.5
        rig.tick()
        assert rig.guard.hangs == HUNG_PASSES  # not read before its time
        rig.now[0] += 0.5
        r = rig.tick()  # tried again, still slow: quarantined at once, the others read in time
        read_in_time(r)
        assert rig.guard.hangs == HUNG_PASSES + 1 and r[f"{NCT}/temp1"].status == Status.STALE
        rig.returned()
        assert rig.hwmon.skip[NCT].endswith(f"read again in {2 * BACKOFF_S:g} s")
    finally:
        rig.close()


class Sluggish:
    """A backend without a ``Quarantine`` (its sample is one read) that answers only once ``answer`` is set
    while ``slow``."""

    kind = "cpu"

    def __init__(self) -> None:
        self.slow, self.reads, self.answer = False, 0, threading.Event()

    def sample(self) -> Sample:
        self.reads += 1
        if self.slow:
            self.answer.wait(30)
        return Sample(0.0, {"cpu/load": Reading("cpu/load", 12.0)})


def test_a_slow_backend_whole_never_blinds_the_backends_after_it(tmp_path):
    ttar.extract(TTAR / "prometheus-procfs-sys-class-thermal-powercap-hwmon.ttar", tmp_path)
    zones = ThermalBackend(str(tmp_path / "fixtures" / "sys"))
    now = [0.0]
    guard = ReadGuard(deadline_s=0.1, clock=lambda: now[0])
    cpu = Sluggish()
    chans = {id(cpu): ["cpu/load"], id(zones): [c.id for d in zones.discover() for c in d.channels]}

    def tick():
        got = asyncio.run(guard.sample([cpu, zones], lambda b: b.sample(), lambda b: chans[id(b)],
                                       time.monotonic))
        return {**got[0].readings, **got[1].readings}
    try:
        cpu.slow = True
        for n in range(HUNG_PASSES):
            with capture_logs() as logs:
                r = tick()
            if n == 0:  # attack12 SH2: the subject of a backend held whole is named, as in read_returned
                assert [e.get("device") for e in logs if e["event"] == "read_hung"] == ["cpu"]
            assert r["thermal:acpitz/temp"].value == -44.0 and r["cpu/load"].status == Status.STALE
            cpu.answer.set()
            until(lambda: id(cpu) not in guard._busy or guard._hangs.held, "the read returned")
            cpu.answer.clear()
        assert id(cpu) in guard._busy  # held for a back-off
        reads = cpu.reads
        assert tick()["thermal:acpitz/temp"].value == -44.0 and cpu.reads == reads
        cpu.slow = False
        now[0] += BACKOFF_S
        r = tick()
        assert r["cpu/load"].value == 12.0 and r["thermal:acpitz/temp"].value == -44.0
        assert id(cpu) not in guard._busy and guard.hangs == HUNG_PASSES
    finally:
        cpu.slow = False
        cpu.answer.set()
        guard.close()
        zones.close()


def test_a_chip_held_only_for_its_back_off_is_still_written(tmp_path):
    """attack12 SH1: a slow chip (its reads answer, late) held for a back-off counted as a chip that does not
    answer, so the apply path wrote none of its fans for up to 300 s: a 95 °C CPU, board fans manual at 34 %.
    A chip whose read hangs now is not written; one held only for its back-off is (its channels stale, the
    safety layer drives its fans to full)."""
    from types import SimpleNamespace

    from aithermd.clock import RealClock
    from aithermd.runtime.sampling import Sampler

    rig = Rig(tmp_path)
    sampler = Sampler(RealClock(), worker=None)
    sampler.guard.close()
    sampler.guard = rig.guard
    world = SimpleNamespace(inline=(rig.hwmon, rig.zones),
                            device_owner={NCT: rig.hwmon, K10: rig.hwmon, "thermal:acpitz": rig.zones})
    try:
        rig.tick()
        rig.io.slow = True
        rig.tick()  # the read overran: hung now, not written
        assert set(sampler.hung(world)) == {NCT}
        rig.returned()
        for _ in range(HUNG_PASSES - 1):
            rig.tick()
            rig.returned()
        assert rig.hwmon.skip[NCT].startswith("read slow") and rig.guard.slow(rig.hwmon, NCT)
        assert sampler.hung(world) == {}  # held for its back-off: its chip answers, it is written
        assert rig.tick()[f"{NCT}/temp1"].status == Status.STALE  # and not read
    finally:
        rig.close()


def test_held_devices_due_at_once_are_read_again_one_a_pass():
    """attack12 SH2: three slow chips held for the same back-off were retried by one pass, each costing the
    loop a deadline (a tick 1.5 s late); now one is released a pass, the others at the next passes."""
    from aithermd.backends.hangs import Hangs

    now = [0.0]
    hangs = Hangs(lambda: now[0])
    chips = [object(), object(), object()]
    for chip in chips:
        for _ in range(HUNG_PASSES):
            hangs.hung(chip, "hwmon3")
        assert hangs.returned(chip, "hwmon3") == BACKOFF_S
    now[0] += BACKOFF_S
    released = [hangs.due() for _ in range(4)]
    assert [len(r) for r in released] == [1, 1, 1, 0]
    assert {id(r[0][0]) for r in released[:3]} == {id(c) for c in chips}


def test_a_pass_taken_ahead_retries_one_held_device_and_its_tick_no_other():
    """attack12 SH2, in the daemon: the pass taken ahead released one held device and the tick that took it
    released the next one into the same pass (two slow retries, a tick 1.47 s long)."""
    now = [0.0]
    guard = ReadGuard(deadline_s=0.1, clock=lambda: now[0])
    chips = [Sluggish(), Sluggish()]  # answering in time by now
    for chip in chips:
        for _ in range(HUNG_PASSES):
            guard._hangs.hung(chip, None)
        guard._hangs.returned(chip, None)
        guard._busy.add(id(chip))
    now[0] += BACKOFF_S
    try:
        assert guard.ahead(chips, lambda b: b.sample(), None, time.monotonic(), lambda: None)
        asyncio.run(guard.sample(chips, lambda b: b.sample(), lambda b: ["cpu/load"], time.monotonic))
        assert len(guard._hangs.held) == 1 and sum(c.reads for c in chips) == 1
    finally:
        guard.close()


def test_a_back_off_doubles_up_to_40_s_and_no_further():
    """retest13 R1: a held chip is unread, so a critical temperature on it goes unseen for the hold (only its
    fans at full): at a 300 s cap the CPU's critical power cut waited out whole holds. The back-off doubles
    10, 20, 40 s and stays at 40 s while the chip overruns at each retry."""
    from aithermd.backends.hangs import BACKOFF_MAX_S, Hangs

    now = [0.0]
    hangs = Hangs(lambda: now[0])
    chip = object()
    for _ in range(HUNG_PASSES):
        hangs.hung(chip, "hwmon3")
    holds = [hangs.returned(chip, "hwmon3")]
    for _ in range(4):  # each retry overruns at once
        now[0] += holds[-1]
        assert hangs.due() == [(chip, "hwmon3")]
        hangs.hung(chip, "hwmon3")
        holds.append(hangs.returned(chip, "hwmon3"))
    assert holds == [10.0, 20.0, 40.0, 40.0, 40.0] and BACKOFF_MAX_S == 40.0
