"""What a RAPL zone is, for totals: a package, a subzone of one, the platform, or a second copy of one.

Sources: Documentation/power/powercap/powercap.rst (zones nest: ``intel-rapl:0:0`` (``core``) is a subzone
of ``intel-rapl:0`` (``package-0``), whose energy already includes it); the intel_rapl driver, which
registers the same package a second time through MMIO on client CPUs since Tiger Lake
(``intel-rapl-mmio:0`` named ``package-0``: the same energy counter, a second set of limits); ``psys``
(platform: package + rest of the SoC, on some laptops and workstations) is not a CPU package; the
``amd_energy`` driver (Documentation/hwmon/amd_energy.rst, Zen 2/3 server parts, removed in 5.16) and the
out-of-tree ``zenergy`` (Zen 1–5): hwmon ``energyN_input`` in µJ labelled ``Esocket<N>`` (one per socket)
and ``Ecore<NNN>``, accumulated in 64 bits by the driver (no wrap seen by readers).

Every total (CPU package power for policies, energy windows, accounting) counts a device when
:func:`aithermd.model.in_total` says so: packages once, GPUs; never a subzone, the platform or a copy.
"""

from __future__ import annotations

import os
import re

from aithermd.backends.sysfs import SysfsIO, read_optional_text

AMD_ENERGY_CHIPS = ("amd_energy", "zenergy")
DEFAULT_MAX_W = 500.0  # a zone stating no max power: above a server socket's PL2 (350–500 W)
_SOCKET = re.compile(r"^Esocket(\d+)$")


def zone_role(name: str, parent: str | None) -> str:
    """``package``, ``platform`` (psys) or the subzone's name (``core``, ``uncore``, ``dram``)."""
    if parent is not None:
        return name.split("#", 1)[0]
    if name.startswith("package"):
        return "package"
    if name == "psys":
        return "platform"
    return name


def max_gap_s(max_range_uj: int | None, max_power_w: float | None) -> float | None:
    """The longest interval over which ``energy_uj`` can be trusted: the time the counter takes to wrap once
    at the zone's highest power (s); None when the range is unknown (then no wrap is assumed either)."""
    if not max_range_uj or max_range_uj <= 0:
        return None
    return max_range_uj / 1e6 / (max_power_w if max_power_w and max_power_w > 0 else DEFAULT_MAX_W)


def amd_energy_sockets(io: SysfsIO, sysfs_root: str) -> list[tuple[int, str, str]]:
    """``[(socket, energyN_input path, chip)]`` of every ``amd_energy``/``zenergy`` hwmon socket counter."""
    class_dir = os.path.join(sysfs_root, "class", "hwmon")
    try:
        names = sorted(io.listdir(class_dir))
    except OSError:
        return []
    out = []
    for hw in names:
        d = os.path.join(class_dir, hw)
        chip = read_optional_text(io, os.path.join(d, "name"))
        if chip not in AMD_ENERGY_CHIPS:
            continue
        try:
            files = io.listdir(d)
        except OSError:
            continue
        for f in sorted(files):
            if not (f.startswith("energy") and f.endswith("_label")):
                continue
            m = _SOCKET.match(read_optional_text(io, os.path.join(d, f)) or "")
            if m is not None:
                out.append((int(m.group(1)), os.path.join(d, f.removesuffix("_label") + "_input"), chip))
    return sorted(out)
