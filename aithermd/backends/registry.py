"""The one place that opens backends and discovers devices.

- :func:`open_backends` builds the backends for one sysfs root (hwmon, powercap/RAPL, thermal zones, cpu,
  and GPUs when an NVML module is given); :func:`open_for_daemon` is what ``aithermd run`` opens: the
  same, NVML when the settings enable it and the bindings import, and the slow hwmon chips (nvme, drivetemp) split off into
  their own worker (:mod:`aithermd.backends.slow`); :func:`open_backend` rebuilds one backend from its
  :meth:`~aithermd.backends.base.Backend.locator` (``aithermd restore`` runs in another process and has only
  the journal's locators).
- :func:`discover` asks every backend for its devices and indexes them in an :class:`Inventory`;
  :func:`rediscover` does it again for the backend families a hotplug event names (off the loop, one
  family's failure keeping its old devices). Start-up, hotplug, resume and reload all take their devices
  from here.
- :func:`reader_for` hands the fast lane a narrow reader of one input, through the backends' public
  ``reader()`` methods (:mod:`aithermd.backends.readers`).

Ids: each backend orders its own devices by bus path and suffixes repeated ids ``#2``, ``#3``
(:mod:`aithermd.backends.ids`); ids of different backends cannot collide by construction (``hwmon:``,
``powercap:``, ``cpu``, ``gpu<N>``), and a collision anyway is logged and the later device dropped, so
every id names exactly one device. The NVML backend keeps each GPU's id by UUID for the daemon's life, so a
GPU that vanishes never renumbers the others.

Backends that notice on their own that their devices changed (NVML adopting a GPU that became ready,
dropping one no longer enumerated, a knob found read-only) say so through ``take_changes()``
(:func:`changed_families`); the runtime then rediscovers them like a hotplug event.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import structlog

from aithermd.backends.base import Backend
from aithermd.backends.ids import natural_key, unique_ids
from aithermd.model import Device, DeviceKind, Event, Knob

__all__ = ["ALL", "BACKENDS", "Inventory", "changed_families", "discover", "family_of", "is_threaded",
           "natural_key", "open_backend", "open_backends", "open_for_daemon", "reader_for", "rediscover",
           "unique_ids"]

BACKENDS = ("hwmon", "hwmon-gpu", "powercap", "thermal", "cpu", "cpuknobs", "nvml")  # the kinds a locator may name
THREADED_KINDS = frozenset({"nvml"})
ALL = "*"  # every family (a rescan after the udev monitor missed events)


def is_threaded(backend: Backend) -> bool:
    """True for backends whose calls may block (NVML): they run off the event loop."""
    return getattr(backend, "kind", "") in THREADED_KINDS or bool(getattr(backend, "blocking", False))


def family_of(backend: Backend) -> str:
    """``hwmon`` for ``hwmon`` and ``hwmon-slow`` backends, else the backend's kind."""
    return str(getattr(backend, "kind", "")).split("-", 1)[0]


@dataclass(frozen=True)
class Inventory:
    """What discovery found. ``backends`` in sample order (``inline`` ones are sampled on the event loop,
    ``threaded`` ones — NVML — in the loop's worker thread; either kind only when it found a device);
    ``devices`` in backend order then each backend's own bus-path order; ``knobs`` knob id → :class:`Knob`;
    ``owner`` knob id → backend; ``device_owner`` device id → backend."""

    backends: tuple[Backend, ...]
    devices: tuple[Device, ...] = ()
    knobs: Mapping[str, Knob] = field(default_factory=lambda: MappingProxyType({}))
    owner: Mapping[str, Backend] = field(default_factory=lambda: MappingProxyType({}))
    device_owner: Mapping[str, Backend] = field(default_factory=lambda: MappingProxyType({}))
    inline: tuple[Backend, ...] = field(init=False, repr=False, compare=False)
    threaded: tuple[Backend, ...] = field(init=False, repr=False, compare=False)
    changing: tuple[Backend, ...] = field(init=False, repr=False, compare=False)  # those with take_changes

    def __post_init__(self) -> None:
        # a backend that found nothing (NVML on a machine without a GPU, thermal zones or RAPL where there are
        # none) has nothing to read: no NVML pass for it every tick, no empty sample in the read guard's pass;
        # a rediscovery that finds a device makes a new inventory
        owners = {id(b) for b in self.device_owner.values()}
        object.__setattr__(self, "inline",
                           tuple(b for b in self.backends if not is_threaded(b) and id(b) in owners))
        object.__setattr__(self, "threaded",
                           tuple(b for b in self.backends if is_threaded(b) and id(b) in owners))
        object.__setattr__(self, "changing",  # asked every tick: the others need no getattr each time
                           tuple(b for b in self.backends if callable(getattr(b, "take_changes", None))))

    def devices_of(self, backend: Backend) -> list[Device]:
        return [d for d in self.devices if self.device_owner.get(d.id) is backend]


def _index(backends: Sequence[Backend], found: Mapping[int, Sequence[Device]]) -> Inventory:
    """An inventory of ``backends`` with the devices ``found`` per backend (by ``id(backend)``), in backend
    order; a repeated device id keeps the first."""
    log = structlog.get_logger("aithermd.registry")
    devices: list[Device] = []
    knobs: dict[str, Knob] = {}
    owner: dict[str, Backend] = {}
    device_owner: dict[str, Backend] = {}
    for backend in backends:
        for device in found.get(id(backend), ()):
            if device.id in device_owner:
                log.warning("duplicate_device", device=device.id, backend=getattr(backend, "kind", "?"))
                continue
            device_owner[device.id] = backend
            devices.append(device)
            for knob in device.knobs:
                knobs[knob.id] = knob
                owner[knob.id] = backend
    return Inventory(tuple(backends), tuple(devices), MappingProxyType(knobs), MappingProxyType(owner),
                     MappingProxyType(device_owner))


def open_backends(sysfs_root: str = "/sys", *, nvml: Any = None, cpu: bool = True) -> list[Backend]:
    """Backends for ``sysfs_root``: hwmon, powercap, thermal zones and the CPU's knobs (EPP, governor, boost,
    platform_profile) always, ``cpu`` (the live machine's
    procfs, the root's cpufreq) when ``cpu`` is true, NVML GPUs when ``nvml`` (a pynvml-compatible module)
    is given. Nothing is read yet."""
    from aithermd.backends.cpu import CpuBackend
    from aithermd.backends.cpu_knobs import CpuKnobBackend
    from aithermd.backends.gpu_hwmon import GPU_DRIVERS, HwmonGpuBackend
    from aithermd.backends.hwmon import HwmonBackend
    from aithermd.backends.powercap import RaplBackend
    from aithermd.backends.thermal import ThermalBackend

    backends: list[Backend] = [HwmonBackend(sysfs_root, leave=GPU_DRIVERS), RaplBackend(sysfs_root),
                               ThermalBackend(sysfs_root), CpuKnobBackend(sysfs_root)]
    if cpu:
        backends.append(CpuBackend(sysfs_root=sysfs_root))
    if nvml is not None:
        from aithermd.backends.nvml import NvmlBackend

        # never probe a real GPU by writing: NvmlBackend decides writability from the uid instead
        backends.append(NvmlBackend(nvml=nvml, probe_writes=False))
    backends.append(HwmonGpuBackend(sysfs_root))  # after NVML: its GPUs are numbered after NVIDIA's
    return backends


def open_for_daemon(settings: Any) -> list[Backend]:
    """The daemon's backends for ``settings`` (a :class:`~aithermd.settings.DaemonSettings`):
    :func:`open_backends` on ``settings.sysfs_root``, NVML when ``settings.nvml`` and the bindings import
    (a warning otherwise; imported only once the NVML library can load, :mod:`aithermd.backends.nvml_lazy`,
    unless ``pynvml`` is already), nvme/drivetemp chips split into the slow lane. Nothing is read yet."""
    nvml: Any = None
    if settings.nvml:
        try:
            if "pynvml" in sys.modules:  # the bindings; the backend decides whether a driver answers
                import pynvml as nvml
            elif importlib.util.find_spec("pynvml") is None:
                raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")
            else:  # imported once NVML can load: nothing to pay for on a machine without the driver
                from aithermd.backends.nvml_lazy import LazyNvml

                nvml = LazyNvml()
            import aithermd.backends.nvml  # noqa: F401
        except ImportError as exc:
            nvml = None
            structlog.get_logger("aithermd.registry").warning("nvml_unavailable", error=str(exc))
    from aithermd.backends.slow import split_slow  # nvme/drivetemp chips: read in a worker of their own
    return split_slow(open_backends(str(settings.sysfs_root), nvml=nvml))


def open_backend(locator: dict[str, Any]) -> Backend:
    """The backend a ``locator()`` dict names: ``{"backend": "hwmon"|"hwmon-gpu"|"powercap"|"thermal"|
    "cpuknobs", "sysfs_root": DIR}``,
    ``{"backend": "cpu"}``, or an NVML locator (handed to ``aithermd.backends.nvml.open_from_locator``).
    Raises ValueError for an unknown backend and ImportError when the NVML module is not available."""
    kind = locator.get("backend")
    root = {"sysfs_root": locator["sysfs_root"]} if "sysfs_root" in locator else {}
    if kind == "hwmon":
        from aithermd.backends.hwmon import HwmonBackend

        return HwmonBackend(**root)
    if kind == "hwmon-gpu":
        from aithermd.backends.gpu_hwmon import HwmonGpuBackend

        return HwmonGpuBackend(**root)
    if kind == "powercap":
        from aithermd.backends.powercap import RaplBackend

        return RaplBackend(**root)
    if kind == "thermal":
        from aithermd.backends.thermal import ThermalBackend

        return ThermalBackend(**root)
    if kind == "cpuknobs":
        from aithermd.backends.cpu_knobs import CpuKnobBackend

        return CpuKnobBackend(**root)
    if kind == "cpu":
        from aithermd.backends.cpu import CpuBackend

        return CpuBackend()
    if kind == "nvml":
        from aithermd.backends.nvml import open_from_locator  # written with the NVML backend

        return open_from_locator(locator)
    raise ValueError(f"unknown backend {kind!r} in locator {locator!r}; known: {', '.join(BACKENDS)}")


def discover(backends: Iterable[Backend]) -> Inventory:
    """Every device of every backend. A backend whose discovery raises is logged and skipped: one broken
    family never hides the others."""
    log = structlog.get_logger("aithermd.registry")
    backends = tuple(backends)
    found: dict[int, Sequence[Device]] = {}
    for backend in backends:
        try:
            _number_after(backend, [d for devs in found.values() for d in devs])
            found[id(backend)] = backend.discover()
        except Exception as exc:  # noqa: BLE001 - one broken family never hides the others
            log.error("fault", device=getattr(backend, "kind", "?"), message=f"discovery failed: {exc}")
    return _index(backends, found)


def changed_families(backends: Iterable[Backend] | Inventory) -> set[str]:
    """The families of ``backends`` (an inventory: its backends) whose ``take_changes()`` says their devices
    changed (each asked once)."""
    if isinstance(backends, Inventory):
        if not backends.changing:  # no backend tells of changes by itself (no set comprehension run)
            return set()
        return {family_of(b) for b in backends.changing if b.take_changes()}  # type: ignore[attr-defined]
    out: set[str] = set()
    for b in backends:
        take = getattr(b, "take_changes", None)
        if callable(take) and take():
            out.add(family_of(b))
    return out


def _number_after(backend: Any, devices: Sequence[Device]) -> None:
    """A backend that numbers GPUs after others' (``index_base``: the hwmon GPUs) starts after the GPUs of
    ``devices``."""
    if hasattr(backend, "index_base"):
        backend.index_base = sum(1 for d in devices if d.kind == DeviceKind.GPU)


async def rediscover(inventory: Inventory, families: set[str], *, t_wall: float,
                     timeout_s: float = 10.0) -> tuple[Inventory, list[Event]]:
    """Rediscover the backends of ``families`` (``*``: all) off the loop, side by side. Returns the new
    inventory (``inventory`` itself when nothing was rediscovered) and the ``hotplug`` events: devices
    added and removed. A backend whose rediscovery fails or takes over
    ``timeout_s`` s keeps its old devices. Knobs that vanished are the caller's to forget."""
    log = structlog.get_logger("aithermd.registry")
    found: dict[int, Sequence[Device]] = {}
    events: list[Event] = []

    async def one(b: Backend) -> None:
        try:
            found[id(b)] = await asyncio.wait_for(asyncio.to_thread(b.discover), timeout_s)
        except Exception as exc:  # noqa: BLE001 - one family's failure (or a hung one) keeps its old devices
            log.error("fault", subject=getattr(b, "kind", "?"), message=f"rediscovery failed: {exc!r}")

    for b in inventory.backends:  # hwmon GPUs follow the NVIDIA GPUs already known
        _number_after(b, [d for o in inventory.backends if o is not b for d in inventory.devices_of(o)])
    await asyncio.gather(*(one(b) for b in inventory.backends if ALL in families or family_of(b) in families))
    if not found:
        return inventory, events
    kept = {id(b): inventory.devices_of(b) for b in inventory.backends if id(b) not in found}
    new = _index(inventory.backends, {**kept, **found})
    before = {d.id: d for d in inventory.devices}
    after = {d.id: d for d in new.devices}
    for dev_id in [d for d in after if d not in before]:
        d = after[dev_id]
        events.append(Event("hotplug", t_wall, dev_id, f"{dev_id} added ({len(d.channels)} channels, "
                            f"{len(d.knobs)} knobs)", {"action": "added"}))
    for dev_id in [d for d in before if d not in after]:
        events.append(Event("hotplug", t_wall, dev_id, f"{dev_id} removed", {"action": "removed"}))
    return new, events


def reader_for(backend: Backend | None, channel_id: str) -> Any:
    """A narrow reader of ``channel_id`` from its backend's public ``reader(channel_id)`` (an
    :class:`~aithermd.backends.readers.HwmonReader` for an hwmon temperature, an
    :class:`~aithermd.backends.readers.NvmlReader` for a GPU's ``gpuN/temperature``), or None when the
    backend offers none for it."""
    reader = getattr(backend, "reader", None)
    return reader(channel_id) if callable(reader) else None
