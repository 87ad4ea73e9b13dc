"""Letting go of a GPU: on request (``aithermctl gpu release gpuN``, D-Bus ``ReleaseGpu``) or when udev says
its PCI device is being removed or unbound.

A driver unbind (``echo … > /sys/bus/pci/drivers/nvidia/unbind``), a hot-remove or ``nvidia-smi drain``
waits for every process that holds the GPU open. So the daemon: puts back every original it journaled for
that GPU's knobs (through the one apply path, off the loop), asks the NVML backend to drop the GPU
(:meth:`~aithermd.backends.nvml.NvmlBackend.release`: its handle forgotten, NVML initialised again without
it), and rediscovers, so the GPU leaves the world and nothing touches it any more. It is adopted again
when udev says it is back (``add``/``bind`` of its PCI device), when the daemon restarts, or — released on
request and no ``remove``/``unbind`` of it seen within :data:`READOPT_S` — by :class:`Released`: an unbind
that never comes (a process holds the GPU, the admin gave up) must not leave a GPU that still runs its job
unwatched for the daemon's life (attack6 G4). A release on request is refused while a safety decision
holds one of its knobs (:func:`safety_hold`).
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
from aithermd.runtime.inbox import Message, Rediscover, Unrelease

READOPT_S = 600.0  # s on the boot clock: an unbind follows a release within seconds when it follows at all


class Released:
    """GPUs released on request, by PCI bus id, adopted again :data:`READOPT_S` after the release unless
    udev said meanwhile that the device was removed, unbound or is back. :meth:`poll` is an inbox source."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.due: dict[str, float] = {}  # bus id (upper case) → boot-clock time of the re-adoption

    def add(self, bus_id: str) -> None:
        if bus_id:
            self.due[bus_id.upper()] = self.clock.monotonic() + READOPT_S

    def settled(self, bus_id: str) -> None:
        """udev had news of the device (removed, unbound, back): nothing to do for it any more."""
        self.due.pop(bus_id.upper(), None)

    def poll(self) -> list[Message]:
        if not self.due:  # the usual tick: nothing released
            return []
        now = self.clock.monotonic()
        due = [bus for bus, at in self.due.items() if at <= now]
        for bus in due:
            del self.due[bus]
            structlog.get_logger("aithermd.release").warning(
                "gpu_readopted", pci_bus_id=bus, after_s=READOPT_S,
                message=f"PCI {bus} was released {READOPT_S:g} s ago and not unbound or removed since: "
                        "adopted again (watched, its critical temperature cut again)")
        return [*(Unrelease(bus) for bus in due), *([Rediscover(frozenset({"nvml"}))] if due else [])]


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
