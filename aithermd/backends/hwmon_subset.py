"""An hwmon backend over a subset of the chips: the slow ones (nvme, drivetemp) or all the others.

Some hwmon drivers answer a read by asking the device: ``nvme`` sends an admin command (Get Log Page,
SMART / Health Information) and ``drivetemp`` a SCT or SMART command to the disk (kernel
Documentation/hwmon/drivetemp.rst, drivers/nvme/host/hwmon.c), so one ``temp1_input`` read can take
tens to hundreds of milliseconds, or hang with the device. :mod:`aithermd.backends.slow` reads those chips
in a worker of their own; the control loop reads the others inline. Both sides are an
:class:`HwmonSubset` of the same ``class/hwmon`` tree, split by driver (the chip's ``name`` attribute).

Ids are exactly those of a full :class:`~aithermd.backends.hwmon.HwmonBackend`: a chip name and its
``#2`` repeats always fall on the same side (the split is by driver name), and every side keeps the bus
path order. A chip with ``pwmN`` knobs always stays on the inline side (knobs are written by the loop and
restored by locator), whatever its driver.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.sysfs import SysfsIO
from aithermd.clock import Clock

SLOW_DRIVERS = ("nvme", "drivetemp")
_PWM = re.compile(r"pwm\d+$")


class HwmonSubset(HwmonBackend):
    """The chips of ``sysfs_root`` whose driver is in ``drivers`` (``keep="only"``) or not in it
    (``keep="except"``); chips with ``pwmN`` knobs are never on the ``only`` side.

    ``locator()`` of the ``only`` side carries ``"lane": "slow"`` so that a restore never mistakes it for
    the inline side (it owns no knob); :func:`aithermd.backends.registry.open_backend` ignores the key."""

    def __init__(self, sysfs_root: str = "/sys", *, drivers: Collection[str] = SLOW_DRIVERS,
                 keep: str = "except", io: SysfsIO | None = None, clock: Clock | None = None,
                 leave: frozenset[str] = frozenset()) -> None:
        if keep not in ("only", "except"):
            raise ValueError(f"keep must be 'only' or 'except', not {keep!r}")
        super().__init__(sysfs_root, io=io, clock=clock, leave=leave)
        self.drivers = frozenset(drivers)
        self.keep = keep

    def _probe(self, hwmon_dir: str) -> tuple[Any, Any, str, str] | None:
        found = super()._probe(hwmon_dir)
        if found is None:
            return None
        chip, attr_dir = found[1], found[2]
        slow = chip.prefix in self.drivers and not self._has_pwm(attr_dir)
        return found if slow == (self.keep == "only") else None

    def _has_pwm(self, attr_dir: str) -> bool:
        try:
            return any(_PWM.match(f) for f in self.io.listdir(attr_dir))
        except OSError:
            return False

    def locator(self) -> dict[str, Any]:
        loc = super().locator()
        if self.keep == "only":
            loc["lane"] = "slow"
        return loc

    def fresh(self) -> HwmonSubset:
        """A new, undiscovered instance over the same tree, split and I/O seam."""
        return HwmonSubset(self.sysfs_root, drivers=self.drivers, keep=self.keep, io=self.io,
                           clock=self.clock, leave=self.leave)

