"""Letting go of a GPU: on request (``aithermctl gpu release gpuN``, D-Bus ``ReleaseGpu``) or when udev says
its PCI device is being removed or unbound.

A driver unbind (``echo … > /sys/bus/pci/drivers/nvidia/unbind``), a hot-remove or ``nvidia-smi drain``
waits for every process that holds the GPU open. So the daemon: puts back every original it journaled for
that GPU's knobs (through the one apply path, off the loop), asks the NVML backend to drop the GPU
(:meth:`~aithermd.backends.nvml.NvmlBackend.release`: its handle forgotten, NVML initialised again without
it), and rediscovers, so the GPU leaves the world and nothing touches it any more. It is adopted again only
when udev says it is back (``add``/``bind`` of its PCI device) or the daemon restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog

from aithermd.actuate.restore import restore_one
from aithermd.errors import Busy, InvalidArgument, UnknownKnob
from aithermd.model import Decision, DeviceKind, Event, Layer
from aithermd.runtime.changes import rediscover


def gpu_of_bus(world: Any, bus_id: str) -> str | None:
    """The id of the GPU on PCI ``bus_id`` (NVML's form, any case), or None."""
    for d in world.devices:
        if d.kind is DeviceKind.GPU and str(d.info.get("pci_bus_id", "")).upper() == bus_id.upper():
            return d.id
    return None


def safety_hold(device: Any, decisions: Mapping[str, Decision]) -> str | None:
    """Why a safety decision holds one of ``device``'s knobs in the last tick's ``decisions`` (knob id →
    Decision), in words, or None."""
    for knob in device.knobs:
        decision = decisions.get(knob.id)
        if decision is not None and decision.layer == Layer.SAFETY:
            value = "" if decision.value is None else f" at {decision.value:g} {knob.unit}".rstrip()
            return f"{knob.id} is held{value} by {decision.rule} ({decision.reason})"
    return None


async def release_gpu(world: Any, executor: Any, device_id: str, t_wall: float,
                      decisions: Mapping[str, Decision] | None = None) -> tuple[Any, list[Event], str]:
    """Restore ``device_id``'s originals through ``executor`` (the one apply path) and drop it (see the
    module doc); call under the tick lock (the tick's inbox does). ``decisions``: the last tick's (knob id
    → Decision), given for a release on request: one refused while a safety decision holds a knob of the
    GPU (a critical-temperature cut lifted by handing back its original limit). Returns the new world,
    the events and a sentence for the caller. Raises UnknownKnob for no such GPU, Busy while safety holds
    it, InvalidArgument for a GPU whose backend cannot let go of it."""
    device = next((d for d in world.devices if d.id == device_id and d.kind is DeviceKind.GPU), None)
    if device is None:
        raise UnknownKnob(f"no GPU {device_id!r}")
    held = safety_hold(device, decisions or {})
    if held:
        raise Busy(f"{device_id} not released: {held}; releasing it now would lift that cut while the GPU "
                   "still runs. Stop its work (or let it cool) and release it once the cut has ended")
    backend = world.device_owner[device_id]
    if not callable(getattr(backend, "release", None)):
        raise InvalidArgument(f"{device_id}: its backend cannot release a GPU")
    applier = executor.applier
    knobs = [k.id for k in device.knobs]
    owned = [k for k in knobs if k in applier.owned]
    applied = await executor.apply(world, [], back=owned, t_wall=t_wall)
    events = list(applied.events)
    kept = []
    for knob_id in [k for k in knobs if k in applier.journal]:  # journaled, not owned (an earlier crash)
        try:
            await asyncio.to_thread(restore_one, applier.journal, backend, knob_id)
        except Exception as exc:  # noqa: BLE001 - it stays journaled for 'aithermd restore'
            kept.append(f"{knob_id} ({exc})")
    await asyncio.to_thread(backend.release, device_id)
    world, found = await rediscover(world, {"nvml"}, applier=applier, t_wall=t_wall)
    events += found
    bus = device.info.get("pci_bus_id", "")
    message = (f"{device_id} (PCI {bus}) released: originals restored, no longer used until it is back"
               + (f"; not restored: {', '.join(kept)}" if kept else ""))
    structlog.get_logger("aithermd.release").info("gpu_released", gpu=device_id, pci_bus_id=bus,
                                                  not_restored=kept)
    events.append(Event("hotplug", t_wall, device_id, message, {"action": "released", "pci_bus_id": bus}))
    return world, events, message
