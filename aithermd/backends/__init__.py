"""Hardware backends: hwmon, powercap/RAPL, thermal zones, cpu, NVML, the AMD and Intel GPUs' hwmon chips,
behind one contract (:mod:`.base`).

:mod:`aithermd.backends.registry` is the one place that opens them and discovers their devices. Backend
modules are imported only when asked for, so ``import aithermd.backends`` stays light.
"""
