"""NVML backend: every NVIDIA GPU through the ``pynvml`` bindings (nvidia-ml-py), or the fake NVML
beneath them.

Devices ``gpu<N>`` (NVML index) with ``info`` uuid, pci_bus_id, name. Channels: ``temperature``,
``memory_temperature`` (°C, thresholds ``slowdown``/``shutdown``/``max_operating``), ``power`` (W),
``energy`` (J), ``utilization``/``memory_utilization`` (%), ``sm_clock``/``memory_clock`` (MHz), ``fan<i>``
(duty %), each only where NVML supports it (decided at discovery). Knobs: ``gpu<N>/power_limit`` (W, min/max
from the limit constraints, default = the board's default limit; read back with ``extra["enforced_w"]``)
and ``gpu<N>/fan<i>`` (duty %, mode ``manual``/``auto``). ``Sample.attrs["gpu<N>"]``: ``clock_event_reasons``
(names), ``persistence_mode``, ``pstate``.

Every NVML call runs on the backend's :class:`~aithermd.backends.nvml_worker.NvmlWorker` thread: the
synchronous methods wait for it (call them off the event loop, as the daemon's sampling executor does), the
``a*`` variants ``await`` it. No driver (``NVML_ERROR_LIBRARY_NOT_FOUND``/``DRIVER_NOT_LOADED``) means zero
GPUs, with the reason in :attr:`NvmlBackend.unavailable`, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd import units
from aithermd.backends.nvml_gpu import GpuReader, Lost, error_names
from aithermd.backends.nvml_procs import ProcessReader
from aithermd.backends.nvml_worker import NvmlWorker
from aithermd.backends.readers import NvmlReader
from aithermd.clock import Clock, RealClock
from aithermd.errors import (
    BackendError,
    BackendTimeout,
    DeviceLost,
    NoPermission,
    NotSupported,
    OutOfRange,
    UnknownKnob,
)
from aithermd.model import Device, GpuUsage, KnobValue, Reading, Sample, Status


class NvmlBackend:
    """GPUs of one NVML library. ``nvml``: the bindings module (default: ``import pynvml``), or a private
    copy over the fake (``FakeNvml.bindings()``). ``probe_writes``: decide at discovery whether NVML lets this
    process write, by writing back the power limit in force and re-asserting each fan's present mode (no
    change) -- used only on the fake NVML: on a real GPU a read-only command must never write, so the real
    bindings get ``probe_writes=False``, which makes every knob read-only without root ("needs root":
    NVML's set calls return NVML_ERROR_NO_PERMISSION for other users) and otherwise writable until a write
    fails. ``index_base``: added to the NVML index
    in device ids (``gpu<base+N>``; a callable is asked at discovery), so a second NVML (fake GPUs beside
    real ones) numbers on."""

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
    ) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.clock = clock or RealClock()
        self.probe_writes = probe_writes
        self.index_base = index_base
        self.unavailable: str | None = None
        self._worker, self._own_worker = worker, worker is None
        self._names = error_names(nvml)
        self._gpus: dict[str, GpuReader] = {}
        self._procs: dict[str, ProcessReader] = {}
        self._devices: list[Device] = []
        self._initialized = False
        self._log = structlog.get_logger("aithermd.nvml")

    @property
    def worker(self) -> NvmlWorker:
        if self._worker is None:
            self._worker = NvmlWorker()
        return self._worker

    # -- discovery -------------------------------------------------------------------------------------
    def discover(self) -> list[Device]:
        """Every GPU NVML enumerates, its capabilities probed once; [] without a driver."""
        return self.worker.run(self._discover)

    async def adiscover(self) -> list[Device]:
        return await self.worker.call(self._discover)

    def _init(self) -> bool:
        nv = self.nvml
        if self._initialized:
            return True
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            name = self._names.get(exc.value, str(exc.value))
            if exc.value in (nv.NVML_ERROR_LIBRARY_NOT_FOUND, nv.NVML_ERROR_DRIVER_NOT_LOADED):
                self.unavailable = name
                return False
            raise BackendError(f"nvmlInit failed: {name}") from exc
        self._initialized, self.unavailable = True, None
        return True

    def _discover(self) -> list[Device]:
        nv = self.nvml
        self._gpus, self._devices, self._procs = {}, [], {}
        if not self._init():
            return []
        base = self.index_base() if callable(self.index_base) else self.index_base
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                reader = GpuReader(
                    nv, index, handle, self.probe_writes, self._names, device_index=base + index
                )
                device = reader.probe()
            except (Lost, nv.NVMLError) as exc:
                self._log.warning(
                    "gpu skipped at discovery",
                    index=index,
                    error=self._names.get(getattr(exc, "value", 15), "NVML_ERROR_GPU_IS_LOST"),
                )
                continue
            self._gpus[reader.id] = reader
            self._devices.append(device)
        return list(self._devices)

    @property
    def gpu_count(self) -> int:
        """GPUs found by the last discovery."""
        return len(self._gpus)

    def reader(self, channel_id: str) -> NvmlReader | None:
        """A reader of GPU ``gpuN``'s temperature and power for ``channel_id`` ``gpuN/temperature`` (the fast
        lane), or None when this backend did not discover that GPU."""
        device_id, _, name = channel_id.partition("/")
        gpu = self._gpus.get(device_id)
        return NvmlReader(gpu, self.worker, device_id) if gpu is not None and name == "temperature" else None

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """One read of every GPU (one worker hop, one batched field read per GPU); a lost GPU is in
        ``Sample.lost`` with its readings failed, the others are read as usual."""
        return self.worker.run(self._sample)

    async def asample(self) -> Sample:
        return await self.worker.call(self._sample)

    def _sample(self) -> Sample:
        t = self.clock.monotonic()
        readings: dict[str, Reading] = {}
        knobs: dict[str, KnobValue] = {}
        attrs: dict[str, dict[str, Any]] = {}
        lost: set[str] = set()
        for reader in self._gpus.values():
            try:
                reader.read(readings, knobs, attrs)
            except Lost:
                lost.add(reader.id)
                for ch in reader.channels.values():
                    readings[ch.id] = Reading(ch.id, None, Status.FAILED, "NVML_ERROR_GPU_IS_LOST")
                for knob in reader.knobs.values():
                    knobs[knob.id] = KnobValue(knob.id, None, None, Status.FAILED)
                attrs[reader.id] = {}
        return Sample(t=t, readings=readings, knobs=knobs, attrs=attrs, lost=frozenset(lost))

    def usage(self) -> list[GpuUsage]:
        """Processes, per-process utilization and memory of every GPU (:mod:`aithermd.backends.nvml_procs`;
        one worker hop). Meant for the accounting cadence, not every tick; a lost GPU gets ``error``."""
        return self.worker.run(self._usage)

    async def ausage(self) -> list[GpuUsage]:
        return await self.worker.call(self._usage)

    def _usage(self) -> list[GpuUsage]:
        out = []
        for reader in self._gpus.values():
            procs = self._procs.get(reader.id)
            if procs is None or procs.gpu is not reader:
                procs = self._procs[reader.id] = ProcessReader(reader)
            try:
                out.append(procs.read())
            except Lost:
                out.append(GpuUsage(reader.id, reader.uuid, None, error="NVML_ERROR_GPU_IS_LOST"))
        return out

    # -- knobs -----------------------------------------------------------------------------------------
    def _knob(self, knob_id: str) -> tuple[GpuReader, str]:
        dev_id, _, attr = knob_id.partition("/")
        reader = self._gpus.get(dev_id)
        if reader is None or attr not in reader.knobs:
            raise UnknownKnob(knob_id)
        return reader, attr

    def _do(self, reader: GpuReader, what: str, fname: str, *args: Any) -> Any:
        nv = self.nvml
        try:
            return reader.call(fname, *args)
        except Lost as exc:
            raise DeviceLost(f"{what}: NVML_ERROR_GPU_IS_LOST") from exc
        except nv.NVMLError as exc:
            name, code = self._names.get(exc.value, str(exc.value)), exc.value
            cls = {
                nv.NVML_ERROR_INVALID_ARGUMENT: OutOfRange,
                nv.NVML_ERROR_NO_PERMISSION: NoPermission,
                nv.NVML_ERROR_NOT_SUPPORTED: NotSupported,
                nv.NVML_ERROR_FUNCTION_NOT_FOUND: NotSupported,
                nv.NVML_ERROR_TIMEOUT: BackendTimeout,
            }.get(code, BackendError)
            raise cls(f"{what}: {name}") from exc

    def write_knob(self, knob_id: str, value: float) -> None:
        """Power limit in W (→ mW, within the limit constraints) or fan duty in % (switches the fan to
        manual). Raises OutOfRange, NoPermission, NotSupported, DeviceLost, BackendTimeout, BackendError,
        UnknownKnob."""
        self.worker.run(self._write, knob_id, value)

    def _write(self, knob_id: str, value: float) -> None:
        reader, attr = self._knob(knob_id)
        knob = reader.knobs[attr]
        if not knob.writable:
            raise (NoPermission if "NO_PERMISSION" in (knob.why_not or "") else NotSupported)(
                f"{knob_id}: {knob.why_not}"
            )
        unit = knob.unit
        if (
            value is None
            or math.isnan(value)
            or (knob.min is not None and value < knob.min)
            or (knob.max is not None and value > knob.max)
        ):
            raise OutOfRange(
                f"{knob_id}: {value} {unit} outside {knob.min:g}–{knob.max:g} {unit}"
                if knob.min is not None and knob.max is not None
                else f"{knob_id}: {value} {unit}"
            )
        if attr == "power_limit":
            self._do(
                reader, f"{knob_id} := {value:g} W", "nvmlDeviceSetPowerManagementLimit", units.w_to_mw(value)
            )
        else:
            self._do(
                reader, f"{knob_id} := {value:g} %", "nvmlDeviceSetFanSpeed_v2", int(attr[3:]), round(value)
            )

    def set_fan_auto(self, knob_id: str) -> None:
        """Hand fan ``knob_id`` back to the driver's automatic curve (nvmlDeviceSetDefaultFanSpeed_v2)."""
        self.worker.run(self._fan_auto, knob_id)

    def _fan_auto(self, knob_id: str) -> None:
        reader, attr = self._knob(knob_id)
        if not attr.startswith("fan"):
            raise UnknownKnob(f"{knob_id} is not a fan")
        self._do(reader, f"{knob_id} := auto", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))

    def read_knob(self, knob_id: str) -> KnobValue:
        return self.worker.run(self._read_knob, knob_id)

    def _read_knob(self, knob_id: str) -> KnobValue:
        reader, attr = self._knob(knob_id)
        nv = self.nvml
        try:
            if attr.startswith("fan"):
                return reader.fan_value(int(attr[3:]))
            limit = reader.call("nvmlDeviceGetPowerManagementLimit")
            enforced, _ = reader.attempt("nvmlDeviceGetEnforcedPowerLimit")
        except (Lost, nv.NVMLError):
            return KnobValue(knob_id, None, None, Status.FAILED)
        extra = {} if enforced is None else {"enforced_w": units.mw_to_w(enforced)}
        return KnobValue(knob_id, units.mw_to_w(limit), None, Status.OK, extra)

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        """Power limit: ``{"limit_mw": int, "uuid"}``; fan: ``{"speed_pct": int, "mode": "auto"|"manual"|None,
        "uuid"}``. The GPU's UUID binds the original to that board: after a crash the NVML index of a GPU can
        change (one removed, a reordered bus), the UUID does not."""
        return self.worker.run(self._save, knob_id)

    def _save(self, knob_id: str) -> dict[str, Any]:
        reader, attr = self._knob(knob_id)
        if attr == "power_limit":
            limit = self._do(reader, f"{knob_id}: read original", "nvmlDeviceGetPowerManagementLimit")
            return {"limit_mw": int(limit), "uuid": reader.uuid}
        kv = reader.fan_value(int(attr[3:]))
        if kv.value is None:
            raise BackendError(f"{knob_id}: cannot read the original fan state")
        return {"speed_pct": int(round(kv.value)), "mode": kv.mode, "uuid": reader.uuid}

    def _saved_reader(self, knob_id: str, saved: dict[str, Any]) -> tuple[GpuReader, str]:
        """The GPU the original was saved from: by its UUID when the journal has one (the index in the knob
        id may now name another board); raises UnknownKnob when that GPU is not here."""
        uuid = saved.get("uuid")
        here = self._gpus.get(knob_id.partition("/")[0])
        if uuid is None or (here is not None and here.uuid == uuid):
            return self._knob(knob_id)  # an older journal without a UUID, or the same board at the index
        attr = knob_id.partition("/")[2]
        for other in self._gpus.values():
            if other.uuid == uuid and attr in other.knobs:
                return other, attr
        raise UnknownKnob(f"{knob_id}: GPU {uuid} is not here (its NVML index now names another board)")

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        """Put back what :meth:`save_knob` returned; a fan that was automatic goes back to automatic."""
        self.worker.run(self._restore, knob_id, saved)

    def _restore(self, knob_id: str, saved: dict[str, Any]) -> None:
        reader, attr = self._saved_reader(knob_id, saved)
        if attr == "power_limit":
            self._do(
                reader,
                f"{knob_id}: restore {saved['limit_mw']} mW",
                "nvmlDeviceSetPowerManagementLimit",
                int(saved["limit_mw"]),
            )
        elif saved.get("mode") == "manual" or (saved.get("mode") is None and not reader.fan_policy):
            self._do(
                reader,
                f"{knob_id}: restore {saved['speed_pct']} %",
                "nvmlDeviceSetFanSpeed_v2",
                int(attr[3:]),
                int(saved["speed_pct"]),
            )
        else:
            self._do(reader, f"{knob_id}: restore auto", "nvmlDeviceSetDefaultFanSpeed_v2", int(attr[3:]))

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
        if self._initialized:
            try:
                self._worker.run(self.nvml.nvmlShutdown)
            except Exception:  # noqa: BLE001 - closing must not fail
                pass
            self._initialized = False
        self._gpus, self._devices = {}, []
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
