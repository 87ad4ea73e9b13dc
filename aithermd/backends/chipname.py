"""lm-sensors chip names (``k10temp-pci-00c3``, ``nct6798-isa-0290``, ``acpitz-acpi-0``) from a hwmon device.

Follows libsensors ``lib/sysfs.c`` (``sensors_read_one_sysfs_chip``) and ``lib/data.c``
(``sensors_snprintf_chip_name``): the prefix is the ``name`` attribute; with no ``device`` link the chip is
virtual (``-virtual-0``); otherwise the bus comes from the basename of the device's ``subsystem`` link (or
its older ``bus`` link) and the address from the device directory's name:

==============  =====================  ============================================
subsystem       device name            chip name
==============  =====================  ============================================
i2c             ``1-002d``             ``w83795g-i2c-1-2d`` (bus 9191 or an adapter
                                       named ``ISA ...``: ``-isa-002d``)
spi             ``spi0.1``             ``max1111-spi-0-1``
pci             ``0000:00:18.3``       ``k10temp-pci-00c3`` (domain<<16|bus<<8|slot<<3|fn)
platform        ``nct6775.656``        ``nct6798-isa-0290`` (the number after the dot)
acpi            ``LNXTHERM:00``        ``acpitz-acpi-0``
hid             ``0003:1B1C:1C0C.0001`` ``corsairpsu-hid-3-1``
mdio_bus        ``stmmac-0:01``        ``...-mdio-1``
scsi            ``0:0:0:0``            ``drivetemp-scsi-0-0``
==============  =====================  ============================================

Without a ``subsystem`` link the same patterns are tried in that order (i2c, spi, pci, then platform).
libsensors drops chips on any other bus; this module names them ``<prefix>-<subsystem>-0`` instead, so no
sensor is lost (none of the reference machines has one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from aithermd.backends.sysfs import SysfsIO, read_optional_text

_I2C = re.compile(r"\s*([+-]?\d+)-\s*([+-]?(?:0[xX])?[0-9a-fA-F]+)")
_SPI = re.compile(r"spi\s*([+-]?\d+)\.\s*([+-]?\d+)")
_PCI = re.compile(r"\s*([0-9a-fA-F]+):\s*([0-9a-fA-F]+):\s*([0-9a-fA-F]+)\.\s*([0-9a-fA-F]+)")
_PLATFORM = re.compile(r"[a-z0-9_]+\.\s*([+-]?\d+)")
_HID = _PCI
_MDIO = re.compile(r"[^:]+:\s*((?:0[xX])?[0-9a-fA-F]+)")
_SCSI = re.compile(r"\s*([+-]?\d+):\s*[+-]?\d+:\s*([+-]?\d+):\s*[+-]?\d+")

ADAPTERS = {
    "isa": "ISA adapter",
    "pci": "PCI adapter",
    "spi": "SPI adapter",
    "virtual": "Virtual device",
    "acpi": "ACPI interface",
    "hid": "HID adapter",
    "mdio": "MDIO adapter",
    "scsi": "SCSI adapter",
}


@dataclass(frozen=True, slots=True)
class ChipName:
    """A parsed lm-sensors chip name: ``str()`` gives the text (``k10temp-pci-00c3``)."""

    prefix: str
    bus: str  # isa | pci | i2c | spi | virtual | acpi | hid | mdio | scsi | <other subsystem>
    addr: int = 0
    bus_nr: int = 0
    adapter: str = ""

    def __str__(self) -> str:
        p, a, n = self.prefix, self.addr, self.bus_nr
        if self.bus in ("isa", "pci"):
            return f"{p}-{self.bus}-{a:04x}"
        if self.bus == "i2c":
            return f"{p}-i2c-{n}-{a:02x}"
        if self.bus in ("spi", "hid", "scsi"):
            return f"{p}-{self.bus}-{n}-{a:x}"
        return f"{p}-{self.bus}-{a:x}"


def _int(text: str, base: int = 10) -> int:
    return int(
        text.replace(" ", ""), 0 if base == 16 and text.lower().lstrip("+-").startswith("0x") else base
    )


def chip_name(
    prefix: str, dev_name: str | None, subsystem: str | None, i2c_adapter_name: str | None = None
) -> ChipName | None:
    """The chip name for a hwmon device called ``prefix`` whose parent device directory is ``dev_name``
    (None: no ``device`` link, a virtual chip) on bus ``subsystem`` (basename of the ``subsystem`` link, or
    None when there is none). ``i2c_adapter_name`` is the name of i2c adapter ``N`` for an i2c chip.
    Returns None only for a device libsensors could not place and that has no subsystem either."""
    if dev_name is None:
        return ChipName(prefix, "virtual", adapter=ADAPTERS["virtual"])
    if subsystem in (None, "i2c") and (m := _I2C.match(dev_name)):
        nr, addr = int(m[1]), _int(m[2], 16)
        if nr == 9191 or (i2c_adapter_name or "").startswith("ISA "):
            return ChipName(prefix, "isa", addr, adapter=ADAPTERS["isa"])
        return ChipName(prefix, "i2c", addr, nr, adapter=i2c_adapter_name or f"i2c-{nr}")
    if subsystem in (None, "spi") and (m := _SPI.match(dev_name)):
        return ChipName(prefix, "spi", int(m[2]), int(m[1]), adapter=ADAPTERS["spi"])
    if subsystem in (None, "pci") and (m := _PCI.match(dev_name)):
        domain, bus, slot, fn = (int(g, 16) for g in m.groups())
        return ChipName(
            prefix, "pci", (domain << 16) + (bus << 8) + (slot << 3) + fn, adapter=ADAPTERS["pci"]
        )
    if subsystem in (None, "platform", "of_platform"):
        m = _PLATFORM.match(dev_name)
        return ChipName(prefix, "isa", int(m[1]) if m else 0, adapter=ADAPTERS["isa"])
    if subsystem == "acpi":
        return ChipName(prefix, "acpi", adapter=ADAPTERS["acpi"])
    if subsystem == "hid" and (m := _HID.match(dev_name)):
        return ChipName(prefix, "hid", int(m[4], 16), int(m[1], 16), adapter=ADAPTERS["hid"])
    if subsystem == "mdio_bus":
        m = _MDIO.match(dev_name)
        return ChipName(prefix, "mdio", _int(m[1], 16) if m else 0, adapter=ADAPTERS["mdio"])
    if subsystem == "scsi" and (m := _SCSI.match(dev_name)):
        return ChipName(prefix, "scsi", int(m[2]), int(m[1]), adapter=ADAPTERS["scsi"])
    if subsystem:
        return ChipName(prefix, subsystem, adapter=f"{subsystem} device")
    return None


def _basename_of_link(io: SysfsIO, path: str) -> str | None:
    try:
        target = io.readlink(path)
    except OSError:
        return None
    return os.path.basename(target.rstrip("/")) or None


def chip_name_for(io: SysfsIO, sysfs_root: str, hwmon_dir: str, prefix: str) -> ChipName | None:
    """The lm-sensors name of the hwmon class device at ``hwmon_dir`` (a path under ``sysfs_root``) whose
    ``name`` attribute is ``prefix``, reading its ``device`` link and that device's ``subsystem`` link."""
    link = os.path.join(hwmon_dir, "device")
    if _basename_of_link(io, link) is None:
        return chip_name(prefix, None, None)
    # The link's own text may be relative to the hwmon directory ("../.."): name the directory it reaches.
    dev_name = os.path.basename(io.realpath(link).rstrip("/"))
    subsystem = _basename_of_link(io, os.path.join(link, "subsystem"))
    if subsystem is None:
        subsystem = _basename_of_link(io, os.path.join(link, "bus"))
    adapter = None
    if subsystem in (None, "i2c") and (m := _I2C.match(dev_name)):
        adapter = read_optional_text(
            io, os.path.join(sysfs_root, "class", "i2c-adapter", f"i2c-{int(m[1])}", "device", "name")
        )
        if adapter is None:
            adapter = read_optional_text(
                io, os.path.join(sysfs_root, "class", "i2c-adapter", f"i2c-{int(m[1])}", "name")
            )
    return chip_name(prefix, dev_name, subsystem, adapter)
