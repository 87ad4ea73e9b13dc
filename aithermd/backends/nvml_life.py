"""NVML over months: initialising it again when it breaks, adopting GPUs that appear late, backing off from
GPUs that are lost, and releasing a GPU on request. Runs on the backend's NVML worker thread.

Source of the facts: the NVML API reference (nvml.h, "Initialization and Cleanup": ``nvmlInit_v2`` attaches
no GPU, ``nvmlDeviceGetHandleBy*`` attach the GPU they return, ``nvmlShutdown`` drops every handle;
``nvmlDeviceGetCount_v2`` also counts GPUs whose handle fails with ``NO_PERMISSION``), and the failures
reported against exporters that initialise NVML once (nvidia_gpu_exporter #65, #110: "Failed to initialize
NVML: Unknown Error" until a restart; dcgm-exporter #329; gpu-monitoring-tools #188: stale metrics after
the host engine restarts).

- **The library.** ``nvmlInit`` failing (driver not loaded yet, a library/driver version mismatch after a
  driver upgrade, Unknown Error) is tried again with backoff (:data:`LIB_BACKOFF_S`: 1 s doubling to 5 min),
  and so is an NVML that breaks under a running daemon (:class:`~aithermd.backends.nvml_probe.Down`): then
  ``nvmlShutdown`` + ``nvmlInit``, and every GPU is looked up again by PCI bus id (handles do not survive).
- **GPUs.** Each GPU is a :class:`Slot`, ``ok``, ``lost`` (``GPU_IS_LOST``) or ``down`` (an error only a
  new ``nvmlInit`` cures). A GPU that is not ``ok`` is not read every tick: it is checked again after a
  backoff (:data:`GPU_BACKOFF_S`: 2 s doubling to 5 min), and comes back when it answers (a ``down`` one
  is also asked its temperature each tick by the backend, and looked up again as soon as it answers).
- **Adoption.** A GPU that NVML enumerates but cannot hand out yet (``NOT_READY``, ``GPU_IS_LOST``,
  ``NO_PERMISSION`` at ``nvmlDeviceGetHandleByIndex``), or one that appears later (a driver loaded late, a GPU
  reset), is adopted when it answers: probed, given an id, and reported as a change (the runtime
  rediscovers, and its originals are journaled before the first write). Ids are stable for the daemon's
  life: a GPU keeps its id by UUID; a new GPU gets ``gpu<NVML index>`` unless another GPU holds that id, then
  the next free number.
- **Expected and present.** Every GPU seen (by UUID), or as many as NVML counts when that is more (one not
  ready yet), is *expected*; those ``ok`` now are *present* (:meth:`NvmlLife.health`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from aithermd.backends.nvml_gpu import GpuReader
from aithermd.backends.nvml_probe import REINIT_CODES, Down, Lost
from aithermd.backends.nvml_reprobe import keep_denied, reprobe
from aithermd.model import Device, Knob

GPU_BACKOFF_S = (2.0, 300.0)
LIB_BACKOFF_S = (1.0, 300.0)
RESCAN_S = 60.0  # how often nvmlDeviceGetCount is asked whether a GPU appeared
UNAVAILABLE = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")
VERSION_HINT = ("the NVIDIA driver was upgraded but the old kernel module is still loaded: reboot, or "
                "reload the nvidia modules (stop every GPU user, then rmmod/modprobe nvidia)")


@dataclass
class Slot:
    """One GPU: its ``reader``, its ``device`` as discovered, and its ``state`` (``ok``, ``lost``,
    ``down``); ``why`` the NVML error name while not ok; ``retry_at`` when it is checked again (monotonic
    s), ``delay`` the backoff before the check after that."""

    reader: GpuReader
    device: Device
    state: str = "ok"
    why: str | None = None
    since: float = 0.0
    retry_at: float = 0.0
    delay: float = GPU_BACKOFF_S[0]

    @property
    def id(self) -> str:
        return self.reader.id

    @property
    def bus_id(self) -> str:
        return str(self.device.info.get("pci_bus_id", ""))


@dataclass
class LibState:
    up: bool = False
    why: str | None = None
    retry_at: float = 0.0
    delay: float = LIB_BACKOFF_S[0]
    reinits: int = 0
    failures: int = 0
    ever_up: bool = False


@dataclass
class NvmlLife:
    """The GPUs of one NVML library (see the module doc). ``nv``: the bindings; ``make_reader(index,
    handle, device_index)`` builds a :class:`GpuReader`; ``names``: error code → name; ``base()``: the first
    device number."""

    nv: Any
    make_reader: Callable[[int, Any, int], GpuReader]
    names: dict[int, str]
    base: Callable[[], int] = lambda: 0
    lib: LibState = field(default_factory=LibState)
    slots: dict[str, Slot] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # uuid → device id, for the daemon's life
    expected: dict[str, str] = field(default_factory=dict)  # uuid → PCI bus id of every GPU seen
    unresolved: dict[int, str] = field(default_factory=dict)  # NVML index → why it has no handle yet
    released: set[str] = field(default_factory=set)  # uuids let go on request
    changed: bool = False
    count: int = 0  # GPUs NVML counted at the last enumeration (lost and released ones included)
    started: bool = False  # the first enumeration is done: GPUs found later are adopted (logged)
    rescan_at: float = 0.0
    rescan_delay: float = GPU_BACKOFF_S[0]

    def __post_init__(self) -> None:
        self._log = structlog.get_logger("aithermd.nvml")

    # -- the library -----------------------------------------------------------------------------------
    def name(self, exc: Any) -> str:
        code = getattr(exc, "value", None)
        if code is None and isinstance(exc, Down):
            return str(exc.args[0])
        return self.names.get(code, f"NVML_ERROR_{code}") if code is not None else type(exc).__name__

    def init(self, now: float) -> bool:
        """``nvmlInit`` (after ``nvmlShutdown`` when it was up). False with ``lib.why`` set on failure (the
        next try after the backoff)."""
        nv, lib = self.nv, self.lib
        if lib.up:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
            lib.up = False
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            why = self.name(exc)
            first = lib.why != why
            lib.why, lib.failures = why, lib.failures + 1
            lib.retry_at = now + lib.delay
            if first:
                hint = VERSION_HINT if why == "NVML_ERROR_LIB_RM_VERSION_MISMATCH" else None
                log = self._log.info if why in UNAVAILABLE and not lib.ever_up else self._log.error
                log("nvml_init_failed", error=why, retry_in_s=lib.delay, hint=hint,
                    message=f"nvmlInit failed: {why}; trying again with backoff")
            lib.delay = min(lib.delay * 2, LIB_BACKOFF_S[1])
            for slot in self.slots.values():
                if slot.state == "ok":
                    self._set(slot, "down", why, now, quiet=True)
            return False
        if lib.ever_up:
            lib.reinits += 1
            self._log.warning("nvml_reinitialised", reinits=lib.reinits, after=lib.why)
        lib.up, lib.ever_up, lib.why, lib.delay = True, True, None, LIB_BACKOFF_S[0]
        return True

    def reinit(self, now: float, why: str) -> None:
        """NVML broke under us (``why``): shut it down and initialise it again, then look up every GPU."""
        self._log.warning("nvml_reinit", reason=why)
        if self.init(now):
            for slot in self.slots.values():
                self._rehandle(slot, now)
            self.enumerate(now)

    # -- each tick -------------------------------------------------------------------------------------
    def maintain(self, now: float) -> None:
        """Whatever is due: initialise NVML again, check lost GPUs, adopt new ones."""
        lib = self.lib
        if not lib.up:
            if now >= lib.retry_at:
                self.reinit(now, lib.why or "not initialised")
            return
        due = [s for s in self.slots.values() if s.state != "ok" and now >= s.retry_at]
        if any(s.why in self._reinit_names() for s in due):
            self.reinit(now, next(s.why for s in due if s.why in self._reinit_names()) or "")
            return
        for slot in due:
            self._rehandle(slot, now)
        if now >= self.rescan_at:
            self.enumerate(now)

    def due(self, now: float) -> bool:
        """Whether :meth:`maintain` has anything to do at ``now`` (reads this object only: no NVML call, so
        the backend asks it without a hop to the worker)."""
        if not self.lib.up:
            return now >= self.lib.retry_at
        return now >= self.rescan_at or any(s.state != "ok" and now >= s.retry_at
                                            for s in self.slots.values())

    def recheck(self, slot: Slot, now: float) -> None:
        """One attempt now, whatever the backoff, to have a lost or down ``slot`` answer again (NVML
        initialised again when it is down): a restore at the stop does not wait for the next retry."""
        if slot.state not in ("lost", "down"):
            return
        if not self.lib.up or slot.why in self._reinit_names():
            self.reinit(now, slot.why or self.lib.why or "not initialised")
        else:
            self._rehandle(slot, now)

    def _reinit_names(self) -> set[str]:
        return {self.names.get(c, "") for c in REINIT_CODES}

    def lose(self, slot: Slot, exc: BaseException, now: float) -> None:
        """A read or write found ``slot`` lost (:class:`Lost`) or NVML down (:class:`Down`)."""
        if isinstance(exc, Lost):
            self._set(slot, "lost", "NVML_ERROR_GPU_IS_LOST", now)
        else:
            self._set(slot, "down", self.name(exc), now)

    def _set(self, slot: Slot, state: str, why: str, now: float, quiet: bool = False) -> None:
        if slot.state == state and slot.why == why:
            return
        was_ok = slot.state == "ok"
        slot.state, slot.why, slot.since = state, why, now
        if was_ok:
            slot.delay = GPU_BACKOFF_S[0]
        # NVML down under a GPU that answered: initialise again at the next tick, then back off
        slot.retry_at = now if was_ok and state == "down" else now + slot.delay
        if not quiet:
            self._log.error("gpu_lost" if state == "lost" else "gpu_down", gpu=slot.id,
                            pci_bus_id=slot.bus_id, uuid=slot.reader.uuid, error=why, retry_in_s=slot.delay,
                            message=f"{slot.id} (PCI {slot.bus_id or '?'}) {why}: not read until it answers "
                                    "again (checked with backoff)")

    def rehandle(self, slot: Slot, now: float) -> None:
        """:meth:`_rehandle` now, whatever the backoff (the GPU :meth:`answers` again)."""
        if slot.state != "ok":
            self._rehandle(slot, now)

    def _rehandle(self, slot: Slot, now: float) -> None:
        """Look ``slot``'s GPU up again (by PCI bus id, else UUID) and probe it; back to ``ok`` on success,
        else checked again after a longer backoff."""
        nv, reader = self.nv, slot.reader
        try:
            try:
                handle = nv.nvmlDeviceGetHandleByPciBusId(slot.bus_id) if slot.bus_id else None
            except nv.NVMLError:
                handle = None
            if handle is None:
                handle = nv.nvmlDeviceGetHandleByUUID(reader.uuid)
            fresh, device = reprobe(lambda: self.make_reader(reader.index, handle, int(slot.id.removeprefix(
                "gpu"))), slot, self.lib.up and slot.state == "down" and slot.why in self._reinit_names())
        except (nv.NVMLError, Lost, Down) as exc:
            why = "NVML_ERROR_GPU_IS_LOST" if isinstance(exc, Lost) else self.name(exc)
            if why == "NVML_ERROR_NOT_FOUND":
                why = "NVML_ERROR_GPU_IS_LOST"  # no longer enumerated: gone from the bus
            if slot.state == "ok":
                self._set(slot, "lost" if why == "NVML_ERROR_GPU_IS_LOST" else "down", why, now)
            else:
                slot.why = why
                slot.delay = min(slot.delay * 2, GPU_BACKOFF_S[1])
                slot.retry_at = now + slot.delay
            return
        fresh.unsupported = reader.unsupported
        fresh._est = reader._est  # noqa: SLF001 - the estimate goes on across a new handle
        if slot.state != "ok":
            self._log.warning("gpu_back", gpu=slot.id, pci_bus_id=slot.bus_id, uuid=reader.uuid,
                              after_s=round(now - slot.since, 1), was=slot.why)
        keep_denied(slot.device, fresh)
        slot.reader, slot.state, slot.why, slot.delay = fresh, "ok", None, GPU_BACKOFF_S[0]
        device = replace(device, knobs=tuple(fresh.knobs.values()))
        if device != slot.device:
            slot.device = device
            self.changed = True

    # -- enumeration and adoption ----------------------------------------------------------------------
    def enumerate(self, now: float) -> None:
        """Every GPU NVML enumerates now: new ones adopted, unready ones remembered (tried again with
        backoff), known ones no longer enumerated dropped (removed from the bus: still expected)."""
        nv = self.nv
        self.rescan_at = now + self.rescan_delay
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._log.warning("nvml_count_failed", error=self.name(exc))
            return
        self.count = count
        unresolved: dict[int, str] = {}
        seen: set[str] = set()
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as exc:
                unresolved[index] = self.name(exc)
                continue
            seen.add(uuid)
            if uuid in self.released or (uuid in self.ids and self.ids[uuid] in self.slots):
                continue
            self._adopt(index, handle, uuid, now, unresolved)
        gone = [s for s in self.slots.values() if not unresolved and s.reader.uuid not in seen]
        for slot in gone:
            self._log.warning("gpu_removed", gpu=slot.id, pci_bus_id=slot.bus_id, uuid=slot.reader.uuid,
                              message=f"{slot.id} (PCI {slot.bus_id or '?'}) is no longer enumerated")
            del self.slots[slot.id]
            self.changed = True
        known_lost = {s.reader.index for s in self.slots.values() if s.state != "ok"}
        for index, why in unresolved.items():
            if self.unresolved.get(index) != why and index not in known_lost:
                self._log.warning("gpu_not_ready", index=index, error=why,
                                  message=f"NVML index {index}: {why}; adopted when it answers")
        self.unresolved = unresolved
        # an unready GPU is looked for again with backoff; otherwise a periodic rescan finds new ones
        self.rescan_delay = min(self.rescan_delay * 2, RESCAN_S) if unresolved else RESCAN_S
        self.rescan_at = now + (self.rescan_delay if unresolved else RESCAN_S)
        if not unresolved:
            self.rescan_delay = GPU_BACKOFF_S[0]
        self.started = True

    def _adopt(self, index: int, handle: Any, uuid: str, now: float, unresolved: dict[int, str]) -> None:
        number = self._number(uuid, self.base() + index)
        reader = self.make_reader(index, handle, number)
        try:
            device = reader.probe()
        except (self.nv.NVMLError, Lost, Down) as exc:
            unresolved[index] = "NVML_ERROR_GPU_IS_LOST" if isinstance(exc, Lost) else self.name(exc)
            return
        self.ids[uuid] = reader.id
        self.expected[uuid] = str(device.info.get("pci_bus_id", ""))
        self.slots[reader.id] = Slot(reader, device, since=now)
        self.slots = dict(sorted(self.slots.items(), key=lambda kv: int(kv[0].removeprefix("gpu"))))
        self.changed = True
        if self.started:
            self._log.warning("gpu_adopted", gpu=reader.id, pci_bus_id=self.expected[uuid], uuid=uuid,
                              message=f"{reader.id} (PCI {self.expected[uuid] or '?'}) adopted")

    def _number(self, uuid: str, wanted: int) -> int:
        known = self.ids.get(uuid)
        if known is not None:
            return int(known.removeprefix("gpu"))
        taken = {int(i.removeprefix("gpu")) for i in self.ids.values()}
        n = wanted
        while n in taken:
            n += 1
        return n

    # -- on request ------------------------------------------------------------------------------------
    def deny(self, slot: Slot, attr: str, why: str | None) -> Knob:
        """Make knob ``attr`` of ``slot`` read-only with ``why`` (a write answered NO_PERMISSION), or
        writable again with None (a write went through)."""
        knob = replace(slot.reader.knobs[attr], writable=why is None, why_not=why)
        slot.reader.knobs[attr] = knob
        slot.device = replace(slot.device, knobs=tuple(slot.reader.knobs.values()))
        self.changed = True
        return knob

    def release(self, device_id: str, now: float) -> Slot:
        """Stop using ``device_id``: forget its handle and look the others up again after a fresh
        ``nvmlInit`` (so NVML no longer holds it attached); it is not adopted again by this daemon until a
        udev event brings it back (:meth:`unrelease`). Raises KeyError for an unknown GPU."""
        slot = self.slots.pop(device_id)
        self.released.add(slot.reader.uuid or "")
        self.changed = True
        self._log.info("gpu_released", gpu=device_id, pci_bus_id=slot.bus_id, uuid=slot.reader.uuid)
        if self.lib.up and self.init(now):
            for other in self.slots.values():
                self._rehandle(other, now)
        return slot

    def unrelease(self, bus_id: str | None = None) -> None:
        """Let released GPUs (those on ``bus_id``; None: all) be adopted again at the next enumeration."""
        keep = {u for u in self.released if bus_id is not None and self.expected.get(u, "").lower()
                != bus_id.lower()}
        if keep != self.released:
            self.released = keep
            self.rescan_at = 0.0

    # -- reporting -------------------------------------------------------------------------------------
    def health(self, now: float, hung: frozenset[str] = frozenset()) -> dict[str, Any]:
        """``{"library", "error", "reinits", "expected", "present", "gpus": {id: {"state", "why", "uuid",
        "pci_bus_id", "next_check_s"}}, "released": {uuid: pci_bus_id}}`` (``hung``: a call not returned)."""
        gpus = {}
        for slot in self.slots.values():
            state = "hung" if slot.id in hung and slot.state == "ok" else slot.state
            gpus[slot.id] = {"state": state, "why": slot.why, "uuid": slot.reader.uuid,
                             "pci_bus_id": slot.bus_id,
                             "next_check_s": round(max(0.0, slot.retry_at - now), 1) if slot.state != "ok"
                             else None}
        # every GPU seen (a removed one too) or counted (one not ready yet); a lost one is both, once
        expected = max(len(set(self.expected) - self.released), self.count - len(self.released))
        present = sum(1 for g in gpus.values() if g["state"] == "ok")
        lib = self.lib
        return {"library": "up" if lib.up else "down", "error": lib.why, "reinits": lib.reinits,
                "init_failures": lib.failures, "expected": expected, "present": present, "gpus": gpus,
                "released": {u: self.expected.get(u, "") for u in sorted(self.released)}}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_id_of(sys_path: str) -> str | None:
    """The PCI bus id in a udev event's sysfs path (``…/0000:01:00.0`` → ``00000000:01:00.0``, NVML's
    form), or None."""
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])(?:/|$)", sys_path or "")
    if m is None:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"
