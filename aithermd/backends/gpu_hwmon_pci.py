"""The PCI id of a GPU hwmon chip's card (:mod:`aithermd.backends.gpu_hwmon` names its devices by it).

Sources: the PCI device directory's ``vendor``/``device`` files (``0x1002``, ``0x744c``), else its
``uevent``'s ``PCI_ID=1002:744C`` line (Documentation/ABI/testing/sysfs-bus-pci)."""

from __future__ import annotations

import os

from aithermd.backends.sysfs import SysfsIO, read_optional_text


def pci_id(io: SysfsIO, device_dir: str) -> str:
    """``1002:744c`` from the PCI device's ``vendor``/``device`` files, else its uevent's ``PCI_ID``; "" when
    neither says."""
    vendor = read_optional_text(io, os.path.join(device_dir, "vendor"))
    device = read_optional_text(io, os.path.join(device_dir, "device"))
    if vendor and device and vendor.startswith("0x") and device.startswith("0x"):
        return f"{vendor[2:]}:{device[2:]}".lower()
    try:
        text = io.read_bytes(os.path.join(device_dir, "uevent")).decode("utf-8", "replace")
    except OSError:
        return ""
    return next((line[7:].lower() for line in text.splitlines() if line.startswith("PCI_ID=")), "")
