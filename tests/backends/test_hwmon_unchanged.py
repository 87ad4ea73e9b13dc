"""An hwmon input whose text is the last good read's keeps that reading (the same object: no parse, no range
check again); anything else — a new value, a failed read, nonsense — is judged afresh, and a good text
after a bad read is parsed again (recorded X570 board through the fault-injecting I/O seam)."""

from __future__ import annotations

import errno

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Status

from .faults import FaultIO
from .helpers import MACHINES_DIR

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
SYSTIN = "hwmon:nct6798-isa-0290/temp1"
FILE = "hwmon1/temp1_input"  # the nct6798's SYSTIN


def test_an_unchanged_text_keeps_its_reading_and_every_other_outcome_is_judged_again():
    io = FaultIO()
    hwmon = HwmonBackend(str(X570), io=io)
    hwmon.discover()
    try:
        first = hwmon.sample().readings[SYSTIN]
        assert first.value == 28.0 and first.status == Status.OK
        again = hwmon.sample().readings[SYSTIN]
        assert again is first  # the same text: the same reading
        io.faults[FILE] = [b"29000\n"]
        moved = hwmon.sample().readings[SYSTIN]
        assert moved.value == 29.0 and moved is not first
        io.faults[FILE] = [b"-273000\n"]  # nonsense: implausible, never the last good value
        assert hwmon.sample().readings[SYSTIN].status == Status.IMPLAUSIBLE
        io.faults[FILE] = [b"29000\n"]  # the last good text after nonsense: parsed and judged again
        back = hwmon.sample().readings[SYSTIN]
        assert back.value == 29.0 and back.status == Status.OK and back is not moved
        io.faults[FILE] = [OSError(errno.EIO, "Input/output error")]
        assert hwmon.sample().readings[SYSTIN].status != Status.OK
        io.faults[FILE] = [b"29000\n"]
        after = hwmon.sample().readings[SYSTIN]
        assert after.value == 29.0 and after.status == Status.OK and after is not back
        assert io.reads[next(p for p in io.reads if p.endswith(FILE))] == 7  # one pread in each of 7 samples
    finally:
        hwmon.close()
