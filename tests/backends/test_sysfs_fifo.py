"""A FIFO in a recorded sysfs tree (``--sysfs-root``) fails its channel instead of blocking discovery and
every sample for ever (``aithermd sensors`` hung)."""

from __future__ import annotations

import os

from aithermd.backends.hwmon import HwmonBackend
from aithermd.model import Status
from tests.support.machines import X570, copy_machine

NCT_DIR = "devices/platform/nct6775.656/hwmon/hwmon1"


def test_a_fifo_attribute_fails_its_channel_and_the_others_read_on(tmp_path):
    root = copy_machine(tmp_path, X570)
    (root / NCT_DIR / "temp2_input").unlink()
    os.mkfifo(root / NCT_DIR / "temp2_input")  # nobody ever writes to it
    backend = HwmonBackend(str(root))
    backend.discover()
    sample = backend.sample()
    assert sample.readings["hwmon:nct6798-isa-0290/temp2"].status == Status.FAILED
    assert sample.readings["hwmon:nct6798-isa-0290/temp1"].value == 28.0
    backend.close()
