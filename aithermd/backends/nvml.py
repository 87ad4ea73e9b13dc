"""NVML backend: every NVIDIA GPU through the ``pynvml`` bindings (nvidia-ml-py), or the fake NVML
beneath them.

Devices ``gpu<N>`` (NVML index at first sight, kept for the daemon's life) with ``info`` uuid, pci_bus_id,
name. Channels: ``temperature``, ``memory_temperature`` (°C, thresholds ``slowdown``/``shutdown``/
``max_operating``), ``power`` (W), ``energy`` (J; integrated from power and marked ``estimated`` on
GPUs without an energy counter), ``utilization``/``memory_utilization`` (%), ``sm_clock``/``memory_clock``
(MHz), ``fan<i>`` (duty %), each only where NVML supports it (decided at discovery). Knobs:
``gpu<N>/power_limit`` (W, min/max from the limit constraints, default = the board's default limit; read
back with ``extra["enforced_w"]``), ``gpu<N>/fan<i>`` (duty %, mode ``manual``/``auto``) and
``gpu<N>/sm_clock_lock`` (MHz, :mod:`.nvml_clocks`; with ``tensor_activity`` (%) from GPM on Hopper and
newer).
``Sample.attrs["gpu<N>"]``: ``clock_event_reasons`` (names), ``persistence_mode``, ``pstate``;
``Sample.health["nvml"]``: the library's and each GPU's health (:meth:`NvmlLife.health
<aithermd.backends.nvml_life.NvmlLife.health>`).

Every NVML call runs on the backend's :class:`~aithermd.backends.nvml_worker.NvmlWorker` (but the fast
lane's temperature reads, on its own thread: :mod:`aithermd.watchers.lanegpus`), under a deadline per GPU:
a GPU whose call hangs is left out (its readings stale, its knobs refused) while the others are read and
written on. NVML that fails to initialise or breaks later, GPUs lost or not ready, are handled by
:mod:`aithermd.backends.nvml_life` (backoff, re-initialisation, adoption); :meth:`NvmlBackend.take_changes`
tells the runtime when the devices changed. No driver means zero GPUs for now (the reason in
:attr:`NvmlBackend.unavailable`), not an error.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from aithermd.backends.energy_rate import CounterGuard
from aithermd.backends.guard import Quarantine
from aithermd.backends.nvml_clocks import close_all
from aithermd.backends.nvml_gpu import Down, GpuReader, Lost, error_names
from aithermd.backends.nvml_knobs import NvmlKnobs
from aithermd.backends.nvml_life import NvmlLife, Slot
from aithermd.backends.nvml_pass import Inline
from aithermd.backends.nvml_procs import ProcessReader
from aithermd.backends.nvml_worker import NvmlWorker
from aithermd.backends.readers import HandleGuard, NvmlReader
from aithermd.clock import Clock, RealClock
from aithermd.errors import BackendTimeout, UnknownKnob
from aithermd.model import Device, GpuUsage, KnobValue, Reading, Sample, Status

T = TypeVar("T")
READ_DEADLINE_S = 0.5  # one GPU's read is a dozen NVML calls of µs to ms: half a second is a hang


class NvmlBackend(NvmlKnobs, Quarantine):
    """GPUs of one NVML library. ``nvml``: the bindings module (default: ``import pynvml``), or a private
    copy over the fake (``FakeNvml.bindings()``). ``probe_writes``: decide at discovery whether NVML lets this
    process write, by writing back the power limit in force and re-asserting each fan's present mode (no
    change) -- used only on the fake NVML: on a real GPU a read-only command must never write, so the real
    bindings get ``probe_writes=False``, which makes every knob read-only without root ("needs root":
    NVML's set calls return NVML_ERROR_NO_PERMISSION for other users) and otherwise writable until a write
    fails. ``index_base``: added to the NVML index in device ids (``gpu<base+N>``; a callable is asked at
    discovery), so a second NVML (fake GPUs beside real ones) numbers on. ``read_deadline_s``: how long one
    NVML call of a GPU's read may take before the GPU counts as hung; ``read_budget_s`` (default: the same)
    its whole read, on the read guard's thread (:class:`~aithermd.backends.nvml_pass.Inline`)."""

    kind = "nvml"
    blocking = True

    def __init__(
        self,
        nvml: Any = None,
        *,
        worker: NvmlWorker | None = None,
        clock: Clock | None = None,
        probe_writes: bool = True,
        index_base: int | Callable[[], int] = 0,
        read_deadline_s: float = READ_DEADLINE_S,
        read_budget_s: float | None = None,
    ) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.clock = clock or RealClock()
        self.probe_writes = probe_writes
        self.index_base = index_base
        self.read_deadline_s = read_deadline_s
        self._worker, self._own_worker = worker, worker is None
        self._names = error_names(nvml)
        if hasattr(type(nvml), "on_load"):  # LazyNvml (nvml_lazy.py): every error name once pynvml is in
            nvml.on_load(lambda real: self._names.update(error_names(real)))
        self.life = NvmlLife(nvml, self._make_reader, self._names, self._base)
        self._procs: dict[str, ProcessReader] = {}
        self._started_us = int(self.clock.wall() * 1e6)  # µs: the first usage read counts no sample before
        # held on the worker while NVML is shut down, initialised or hands out new handles: the fast lane's
        # own reads (NvmlReader.temperature_now) skip a poll meanwhile instead of using a dropped handle
        self.handles = HandleGuard()
        self._inline = Inline(lambda: self.worker, read_deadline_s, self.handles, read_budget_s)  # tick reads
        self._energy = CounterGuard()  # an energy counter's implausible jump is a bad sample
        self._log = structlog.get_logger("aithermd.nvml")

    def _base(self) -> int:
        return self.index_base() if callable(self.index_base) else self.index_base

    def _make_reader(self, index: int, handle: Any, device_index: int) -> GpuReader:
        reader = GpuReader(self.nvml, index, handle, self.probe_writes, self._names,
                           device_index=device_index)
        reader.beat = self.worker.beat
        return reader

    def _exclusive(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` (same name) run with :attr:`handles` held exclusively (the fast lane's reads in flight
        waited for :attr:`read_deadline_s` at most: one stuck in a hung GPU never holds the worker up)."""

        @functools.wraps(fn)
        def exclusively(*args: Any) -> T:
            with self.handles.exclusive(self.read_deadline_s):
                return fn(*args)

        return exclusively

    @property
    def reading(self) -> str | None:  # type: ignore[override]  # the read guard's Quarantine (nvml_pass)
        return self._inline.reading

    @property
    def skip(self) -> Any:  # type: ignore[override]
        return self._inline.skip

    def hung_at(self) -> float | None:
        return self._inline.hung_at()

    @property
    def worker(self) -> NvmlWorker:
        if self._worker is None:
            self._worker = NvmlWorker()
        return self._worker

    @property
    def unavailable(self) -> str | None:
        """Why NVML is not initialised now (``NVML_ERROR_DRIVER_NOT_LOADED``, ...), or None."""
        return None if self.life.lib.up else self.life.lib.why

    # -- discovery -------------------------------------------------------------------------------------
    def discover(self) -> list[Device]:
        """Every GPU NVML hands out now, its capabilities probed once; [] without a driver. Called again
        (hotplug, :meth:`take_changes`), it keeps the GPUs it knows and their ids, adopts new ones and
        drops those no longer enumerated."""
        return self.worker.run(self._exclusive(self._discover))

    async def adiscover(self) -> list[Device]:
        return await self.worker.call(self._exclusive(self._discover))

    def _discover(self) -> list[Device]:
        life, now = self.life, self.clock.monotonic()
        if not life.lib.up:
            if not life.init(now):
                return self.devices()
        life.enumerate(now)
        life.changed = False
        return self.devices()

    def devices(self) -> list[Device]:
        """The GPUs known now (lost ones included), in id order."""
        return [slot.device for slot in self.life.slots.values()]

    def take_changes(self) -> bool:
        """True (once) when the devices changed since the last discovery: a GPU adopted or dropped, a knob
        found read-only or writable again, power-limit constraints read again; the runtime then rediscovers
        this backend."""
        changed, self.life.changed = self.life.changed, False
        return changed

    @property
    def gpu_count(self) -> int:
        """GPUs known now."""
        return len(self.life.slots)

    def reader(self, channel_id: str) -> NvmlReader | None:
        """A reader of GPU ``gpuN``'s temperature and power for ``channel_id`` ``gpuN/temperature`` (the fast
        lane), or None when this backend does not know that GPU."""
        device_id, _, name = channel_id.partition("/")
        slot = self.life.slots.get(device_id)
        if slot is None or name != "temperature":
            return None
        return NvmlReader(slot.reader, self.worker, device_id, self.read_deadline_s, self.handles)

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """One read of every GPU: what is due first (a new ``nvmlInit``, a lost GPU's check, adoption),
        then one pass over the GPUs that answer, each under :attr:`read_deadline_s`. A lost, down or hung
        GPU is in ``Sample.lost`` with its readings failed (stale while hung); the others are read as
        usual."""
        t = self.clock.monotonic()
        try:
            if self.life.due(t):  # most ticks nothing is: no hop for it
                self.worker.run(self._exclusive(self.life.maintain), t)
        except BackendTimeout as exc:
            self._log.error("nvml_maintenance_hung", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - an NVML fault never ends the sample
            self._log.error("nvml_maintenance_failed", error=f"{type(exc).__name__}: {exc}")
        self._ask_down(t)
        slots = list(self.life.slots.values())
        live = [(s.id, s) for s in slots if s.state == "ok"]
        results = self._inline.each(live, lambda slot: self._read_one(slot, t))
        if results is None:  # the read guard gave up on this pass (a GPU hung): nobody takes its sample
            return Sample(t=t, readings={})
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        attrs: dict[str, dict[str, Any]] = {}
        lost: set[str] = set()
        hung = self.worker.hung_gpus
        for slot in slots:
            got = results.get(slot.id)
            if isinstance(got, BaseException):
                self.life.lose(slot, got, t)
            elif got is not None:
                readings.update(got[0])
                knobs.update(got[1])
                attrs.update(got[2])
                continue
            lost.add(slot.id)
            if slot.id in hung and slot.state == "ok":
                status, why = Status.STALE, self._inline.skip.get(slot.id)
            else:
                status = Status.FAILED
                left = max(0.0, slot.retry_at - t)
                why = f"{slot.why} (PCI {slot.bus_id or '?'}); checked again in {left:.0f} s"
            for ch in slot.reader.channels.values():
                readings[ch.id] = Reading(ch.id, None, status, why)
            for knob in slot.reader.knobs.values():
                knobs[knob.id] = KnobValue(knob.id, None, None, Status.FAILED)
            attrs[slot.id] = {}
        # energy over time is judged on the boot clock: a GPU kept powered through a suspend spends
        # energy while the monotonic clock stands still (attack8 T8)
        self._energy.check_devices(readings, self.clock.boottime(), [s.device for s in slots])
        return Sample(t=t, readings=readings, knobs=knobs, attrs=attrs, lost=frozenset(lost),
                      health={"nvml": self.life.health(t, hung)})

    def usage(self) -> list[GpuUsage]:
        """Processes, per-process utilization and memory of every GPU (:mod:`aithermd.backends.nvml_procs`;
        one pass on the worker, each GPU under its deadline). Meant for the accounting cadence, not every
        tick; a GPU that is lost, down or hung gets ``error``."""
        slots = list(self.life.slots.values())
        got = self.worker.each([(s.id, s) for s in slots if s.state == "ok"], self._usage_one,
                               self.read_deadline_s)
        out = []
        for slot in slots:
            usage = got.get(slot.id)
            if not isinstance(usage, GpuUsage):
                why = slot.why or ("NVML call hung" if self.worker.hung(slot.id) else "not read")
                usage = GpuUsage(slot.id, slot.reader.uuid, None, error=why)
            out.append(usage)
        return out

    async def ausage(self) -> list[GpuUsage]:
        return await asyncio.to_thread(self.usage)

    def _usage_one(self, slot: Slot) -> GpuUsage:
        procs = self._procs.get(slot.id)
        if procs is None or procs.gpu is not slot.reader:
            procs = self._procs[slot.id] = ProcessReader(
                slot.reader, started_us=self._started_us, wall=self.clock.wall,
                last_seen_us=0 if procs is None else procs.last_seen_us)
        try:
            return procs.read()
        except Lost:
            return GpuUsage(slot.id, slot.reader.uuid, None, error="NVML_ERROR_GPU_IS_LOST")
        except Down as exc:
            return GpuUsage(slot.id, slot.reader.uuid, None, error=str(exc.args[0]))

    def _ask_down(self, t: float) -> None:
        """A GPU ``down`` for an error of its own (the library up) is asked its temperature each tick, under
        the read deadline (not while a call on it hangs): once it answers it is probed and read again at
        this tick, not at its next backoff check (up to 5 min). A ``lost`` GPU (off the bus) waits for its
        backoff, as does NVML down as a whole."""
        life = self.life
        down = [(s.id, s) for s in life.slots.values() if s.state == "down"] if life.lib.up else []
        if down:
            answered = self.worker.each(down, self._answers, self.read_deadline_s)
            for slot in [s for i, s in down if answered.get(i) is True]:
                self.worker.run(self._exclusive(life.rehandle), slot, t)

    def _answers(self, slot: Slot) -> bool:
        """Whether ``slot``'s GPU, looked up by PCI bus id, tells its temperature now (two NVML calls)."""
        nv = self.life.nv
        try:
            handle = nv.nvmlDeviceGetHandleByPciBusId(slot.bus_id) if slot.bus_id else \
                nv.nvmlDeviceGetHandleByUUID(slot.reader.uuid)
            nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
        except Exception:  # noqa: BLE001 - any failure: not yet
            return False
        return True

    @staticmethod
    def _read_one(slot: Slot, t: float) -> Any:
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        attrs: dict[str, dict[str, Any]] = {}
        try:
            slot.reader.read(readings, knobs, attrs, t)
        except (Lost, Down) as exc:
            return exc
        return readings, knobs, attrs

    # -- release ---------------------------------------------------------------------------------------
    def release(self, device_id: str) -> None:
        """Stop using GPU ``device_id`` (restore its knobs first: this only lets go of it): its handle is
        dropped, NVML initialised again without it, and it is not adopted again until :meth:`unrelease`.
        Raises UnknownKnob for a GPU this backend does not know."""
        if device_id not in self.life.slots:
            raise UnknownKnob(f"no GPU {device_id}")
        self.worker.run(self._exclusive(self.life.release), device_id, self.clock.monotonic())

    def unrelease(self, bus_id: str | None = None) -> None:
        """Released GPUs on PCI ``bus_id`` (None: all) may be adopted again (a udev add brought it back)."""
        self.life.unrelease(bus_id)

    # -- lifecycle -------------------------------------------------------------------------------------
    def locator(self) -> dict[str, Any]:
        """``{"backend": "nvml"}``, plus ``"fake_state": PATH`` over a fake NVML that keeps a state file."""
        loc: dict[str, Any] = {"backend": "nvml"}
        try:
            path = getattr(getattr(self.nvml, "nvmlLib", None), "state_path", None)
        except Exception:  # noqa: BLE001 - a real CDLL answers unknown names with AttributeError or worse
            path = None
        if path is not None:
            loc["fake_state"] = str(path)
        return loc

    def close(self) -> None:
        """nvmlShutdown (when this backend initialised NVML) and stop the worker thread."""
        if self._worker is None:
            return
        if self.life.lib.up:
            readers = [slot.reader for slot in self.life.slots.values()]
            self._worker.run(close_all, readers, self.nvml)  # GPM sample buffers (nvml_clocks.py)
            try:
                self._worker.run(self._exclusive(self.nvml.nvmlShutdown))
            except Exception:  # noqa: BLE001 - closing must not fail
                pass
            self.life.lib.up = False
        self.life.slots = {}
        if self._own_worker:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_from_locator(locator: dict[str, Any]) -> NvmlBackend:
    """Rebuild the backend :meth:`NvmlBackend.locator` described, in another process (``aithermd restore``):
    the fake NVML's state file when it names one (same GPUs, limits and fan modes), else the real bindings.
    Raises OSError/ValueError for an unreadable fake state file, ImportError without ``pynvml``."""
    path = locator.get("fake_state")
    if path:
        from aithermd.sim.fake_nvml import FakeNvml

        return NvmlBackend(nvml=FakeNvml.open(path).bindings())
    import pynvml

    return NvmlBackend(nvml=pynvml, probe_writes=False)


def gpu_backends(*, live: bool, dumps: Sequence[str | Path] = ()) -> list[NvmlBackend]:
    """The GPU backends of a command: the real NVML when ``live`` (zero GPUs without a driver, none at all
    without ``pynvml``), then one fake NVML with the GPUs of ``dumps`` (``nvidia-smi -q`` text/XML or profile
    JSON), numbered after the real ones. Raises :class:`~aithermd.sim.smi_dump.DumpError` for a bad dump."""
    backends: list[NvmlBackend] = []
    if live:
        try:
            import pynvml
        except ImportError:
            pynvml = None
        if pynvml is not None:
            backends.append(NvmlBackend(nvml=pynvml, probe_writes=False))
    if dumps:
        from aithermd.sim.fake_nvml import FakeNvml

        fake = FakeNvml.from_dumps(dumps)
        real = backends[0] if backends else None
        backends.append(NvmlBackend(nvml=fake.bindings(), index_base=lambda: real.gpu_count if real else 0))
    return backends
