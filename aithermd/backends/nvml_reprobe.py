"""Probing a GPU again once it is looked up anew (:meth:`NvmlLife._rehandle
<aithermd.backends.nvml_life.NvmlLife._rehandle>`): what the fresh reader keeps of the old one, and a GPU
*partial*: one of its reads answers a code only a new ``nvmlInit`` should cure (``NVML_ERROR_UNKNOWN``:
nvidia-smi's "Unknown Error" in one field of a degrading card) while NVML was just initialised again and
every other call of that GPU answers (attack11 G2).

Such a GPU used to stay ``down`` for good: skipped, its fans left at whatever manual duty the policy last
wrote with the die unread, where any other error code on that read made it a failed sensor whose fans go to
full. Now it is probed again as partial (:attr:`GpuProbe.partial <aithermd.backends.nvml_probe.GpuProbe>`):
a read's REINIT code is that reading's failure (its channel FAILED: the sensor trust confirms it and the
safety layer drives the GPU's fans to full), not NVML down; a read whose every call fails so is NVML down
after all (:meth:`GpuReader.read <aithermd.backends.nvml_gpu.GpuReader.read>`). It is kept partial only
when that probe finds every channel and knob the GPU had: a GPU that answers less is left down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from aithermd.backends.nvml_gpu import GpuReader
from aithermd.backends.nvml_probe import Down, Lost
from aithermd.model import Device

_log = structlog.get_logger("aithermd.nvml")


def reprobe(make: Callable[[], GpuReader], slot: Any, cured_nothing: bool) -> tuple[GpuReader, Device]:
    """A fresh reader of ``slot``'s GPU (``make()``) and its probed device. A GPU partial stays so; one
    whose probe raises :class:`Down` though ``cured_nothing`` (NVML was initialised again for that very
    error) is probed again as partial (see the module doc). Raises what the probe raised (Down, Lost,
    NVMLError)."""
    fresh = make()
    fresh.partial = slot.reader.partial
    try:
        return fresh, fresh.probe()
    except Down as exc:
        if fresh.partial or not cured_nothing:
            raise
        fresh = make()
        fresh.partial = True
        try:
            device = fresh.probe()
        except (fresh.nv.NVMLError, Down, Lost):
            raise exc from None
        had = slot.device
        if {c.id for c in had.channels} - {c.id for c in device.channels} or \
                {k.id for k in had.knobs} - {k.id for k in device.knobs}:
            raise exc from None
        why = str(exc.args[0])
        _log.warning("gpu_partial", gpu=slot.id, pci_bus_id=slot.bus_id, error=why,
                     message=f"{slot.id}: {why} on some reads after NVML was initialised again, while its "
                             "other calls answer: those readings fail (a failed sensor), the rest is read")
        return fresh, device


def keep_denied(old: Device, fresh: GpuReader) -> None:
    """Knobs found read-only at a write stay read-only when the re-probe did not try a write (as root it
    calls them writable); one that did try tells (only a knob that never took a write is denied)."""
    for knob in old.knobs if not getattr(fresh, "probe_writes", False) else ():
        attr = knob.id.partition("/")[2]
        if not knob.writable and attr in fresh.knobs and fresh.knobs[attr].writable:
            fresh.knobs[attr] = replace(fresh.knobs[attr], writable=False, why_not=knob.why_not)
