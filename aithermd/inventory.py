"""Which backends a machine has, and the devices they found.

:func:`open_backends` builds the list of backends for one sysfs root (hwmon, powercap/RAPL, cpu, and GPUs
when an NVML module is given); :func:`discover` asks each for its devices. Each backend orders its own
devices by bus path and suffixes repeated ids ``#2``, ``#3`` (:mod:`aithermd.backends.ids`); ids of
different backends cannot collide by construction (``hwmon:``, ``powercap:``, ``cpu``, ``gpu<N>``), and a
collision anyway is logged and the later device dropped, so every id names exactly one device.
"""

from __future__ import annotations

from typing import Any

from aithermd import log
from aithermd.backends.base import Backend
from aithermd.backends.ids import natural_key, unique_ids
from aithermd.model import Device

__all__ = ["discover", "natural_key", "open_backends", "unique_ids"]


def open_backends(sysfs_root: str = "/sys", *, nvml: Any = None, cpu: bool = True) -> list[Backend]:
    """Backends for ``sysfs_root``: hwmon and powercap always, ``cpu`` (the live machine's procfs, the
    root's cpufreq) when ``cpu`` is true, NVML GPUs when ``nvml`` (a pynvml-compatible module) is given. Nothing is read yet."""
    from aithermd.backends.cpu import CpuBackend
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.backends.powercap import RaplBackend

    backends: list[Backend] = [HwmonBackend(sysfs_root), RaplBackend(sysfs_root)]
    if cpu:
        backends.append(CpuBackend(sysfs_root=sysfs_root))
    if nvml is not None:
        from aithermd.backends.nvml import NvmlBackend  # written with the NVML backend

        # never probe a real GPU by writing: NvmlBackend decides writability from the uid instead
        backends.append(NvmlBackend(nvml=nvml, probe_writes=False))
    return backends


def discover(backends: list[Backend]) -> list[Device]:
    """Every device of every backend, in backend order then each backend's own (bus path) order.

    A backend whose discovery raises is logged and skipped: one broken family never hides the others."""
    logger = log.get("aithermd.inventory")
    devices: list[Device] = []
    seen: set[str] = set()
    for backend in backends:
        try:
            found = backend.discover()
        except Exception as exc:  # noqa: BLE001 - a broken backend must not hide the others
            logger.warning("discovery failed", backend=getattr(backend, "kind", "?"), error=str(exc))
            continue
        for device in found:
            if device.id in seen:
                logger.warning(
                    "duplicate device id dropped", device=device.id, backend=getattr(backend, "kind", "?")
                )
                continue
            seen.add(device.id)
            devices.append(device)
    return devices
