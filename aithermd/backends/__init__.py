"""Hardware backends (hwmon, powercap/RAPL, cpu, nvml) and :func:`open_backend`, which rebuilds one from its
:meth:`~aithermd.backends.base.Backend.locator` (``aithermd restore`` runs in another process).

Backend modules are imported only when asked for, so ``import aithermd.backends`` stays light.
"""

from __future__ import annotations

from typing import Any

from aithermd.backends.base import Backend

BACKENDS = ("hwmon", "powercap", "thermal", "cpu", "nvml")


def open_backend(locator: dict[str, Any]) -> Backend:
    """The backend a ``locator()`` dict names: ``{"backend": "hwmon"|"powercap", "sysfs_root": DIR}``,
    ``{"backend": "cpu"}``, or an NVML locator (handed to ``aithermd.backends.nvml.open_from_locator``).
    Raises ValueError for an unknown backend and ImportError when the NVML module is not available."""
    kind = locator.get("backend")
    root = {"sysfs_root": locator["sysfs_root"]} if "sysfs_root" in locator else {}
    if kind == "hwmon":
        from aithermd.backends.hwmon import HwmonBackend

        return HwmonBackend(**root)
    if kind == "powercap":
        from aithermd.backends.powercap import RaplBackend

        return RaplBackend(**root)
    if kind == "thermal":
        from aithermd.backends.thermal import ThermalBackend

        return ThermalBackend(**root)
    if kind == "cpu":
        from aithermd.backends.cpu import CpuBackend

        return CpuBackend()
    if kind == "nvml":
        from aithermd.backends.nvml import open_from_locator  # written with the NVML backend

        return open_from_locator(locator)
    raise ValueError(f"unknown backend {kind!r} in locator {locator!r}; known: {', '.join(BACKENDS)}")
