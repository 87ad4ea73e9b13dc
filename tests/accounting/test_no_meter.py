"""No energy meter, no accounting pass: on a machine without a GPU and without a RAPL package zone there are
no joules to share out, so the process table is never scanned; a package zone starts the passes."""

from __future__ import annotations

import asyncio

from aithermd.accounting.service import EnergyService
from aithermd.model import Channel, Device, DeviceKind, Quantity, Reading, Snapshot
from tests.accounting.bench import _device
from tests.support.clock import SimClock

BOARD = Device("hwmon:nct6798-isa-0290", DeviceKind.HWMON, "nct6798", channels=(
    Channel("hwmon:nct6798-isa-0290/temp1", "hwmon:nct6798-isa-0290", "temp1", Quantity.TEMPERATURE, "°C"),))
PACKAGE = _device("powercap:package-0", DeviceKind.POWERCAP, {"zone": "package-0"})


class CountingTable:
    def __init__(self) -> None:
        self.scans = 0

    def scan(self) -> dict:
        self.scans += 1
        return {}


async def _run(devices: tuple[Device, ...], seconds: int) -> CountingTable:
    clock, table = SimClock(), CountingTable()
    service = EnergyService(clock, None, table=table, interval_s=5.0)
    for seq in range(1, seconds + 1):
        readings = {c.id: Reading(c.id, 40.0 if c.quantity is Quantity.TEMPERATURE else 10.0 * seq)
                    for d in devices for c in d.channels}
        service.on_publish(Snapshot(seq, clock.monotonic(), clock.wall(), devices, readings))
        await asyncio.sleep(0)  # a pass started runs its scan in a thread
        if service._task is not None:
            await service._task
        clock.advance(1.0)
    service.stop()
    return table


async def test_a_board_without_energy_meters_is_never_scanned():
    assert (await _run((BOARD,), 30)).scans == 0


async def test_a_rapl_package_zone_is_accounted_every_interval():
    assert (await _run((BOARD, PACKAGE), 30)).scans == 5  # t = 5, 10, 15, 20, 25 s after the first snapshot


def test_the_process_table_never_imports_psutil():
    import subprocess
    import sys

    code = ("import sys; from aithermd.accounting.procs import ProcessTable; t = ProcessTable(); "
            "print('psutil' in sys.modules); t.scan(); print('psutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]  # /proc/PID/stat read directly (accounting/procs.py)
