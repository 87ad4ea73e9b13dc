"""A GPU's locked SM clocks and its GPM tensor activity, through NVML.

Facts from the NVML API reference (nvml.h), in MHz and %:

- **Locked clocks** (``nvmlDeviceSetGpuLockedClocks(dev, minMHz, maxMHz)``, Volta and newer, root only):
  the knob ``gpu<N>/sm_clock_lock`` is the top of the locked range, from the lowest graphics clock the
  card lists (``nvmlDeviceGetSupportedGraphicsClocks`` at its memory clock) to its highest
  (``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)``), which means unlocked: writing it resets the lock
  (``nvmlDeviceResetGpuLockedClocks``). NVML has no call that reads a lock back, so the value read is the
  one this process set (the top, unlocked, until it sets one), and the original journaled before the
  first write is "unlocked": a restore resets the lock. A lock another tool set before aithermd started is
  therefore not kept across aithermd's restore (NVML offers no way to see it).
- **GPM** (``nvmlGpmQueryDeviceSupport``, Hopper and newer): two samples a tick apart give the share of
  time the SMs ran tensor work (``NVML_GPM_METRIC_ANY_TENSOR_UTIL``), channel ``gpu<N>/tensor_activity``.
"""

from __future__ import annotations

from typing import Any

from aithermd.model import UNITS, Channel, Knob, KnobKind, KnobValue, Quantity, Reading, Status

KNOB = "sm_clock_lock"
CHANNEL = "tensor_activity"
ANY_TENSOR_UTIL = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL


class GpuClocks:
    """What one GPU offers of the above, decided once at discovery by :meth:`probe`."""

    def __init__(self, gpu_id: str) -> None:
        self.gpu_id = gpu_id
        self.knob: Knob | None = None
        self.top_mhz: int | None = None
        self.floor_mhz: int | None = None
        self.locked_mhz: float | None = None  # what this process set (None: unlocked, as far as we know)
        self.channel: Channel | None = None
        self._gpm: list[Any] | None = None  # two samples, the older first
        self._gpm_ready = False

    # -- discovery -------------------------------------------------------------------------------------
    def probe(self, p: Any, writable_why: str | None) -> None:
        """Probe through ``p`` (a :class:`~aithermd.backends.nvml_probe.GpuProbe`); ``writable_why`` is
        why NVML writes are refused to this process (None: allowed)."""
        nv = p.nv
        top, code = p.attempt("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM)
        mem, mcode = p.attempt("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_MEM)
        clocks = None
        if code is None and mcode is None:
            clocks, ccode = p.attempt("nvmlDeviceGetSupportedGraphicsClocks", mem)
            if ccode is not None:
                current, _ = p.attempt("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM)
                clocks = None if current is None else p.attempt("nvmlDeviceGetSupportedGraphicsClocks",
                                                                current)[0]
        if clocks and hasattr(nv, "nvmlDeviceSetGpuLockedClocks"):
            self.top_mhz, self.floor_mhz = int(top), int(min(clocks))
            self.knob = Knob(f"{self.gpu_id}/{KNOB}", self.gpu_id, KnobKind.SM_CLOCK_LOCK, "MHz",
                             min=float(self.floor_mhz), max=float(self.top_mhz), default=float(self.top_mhz),
                             writable=writable_why is None, why_not=writable_why)
        support, gcode = p.attempt("nvmlGpmQueryDeviceSupport")
        if gcode is None and support.isSupportedDevice:
            try:
                self._gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                p.call("nvmlGpmSampleGet", self._gpm[0])  # the first tick has an interval to read
                self._gpm_ready = True
            except nv.NVMLError:
                self._gpm = None
            if self._gpm is not None:
                self.channel = Channel(f"{self.gpu_id}/{CHANNEL}", self.gpu_id, CHANNEL, Quantity.UTILIZATION,
                                       UNITS[Quantity.UTILIZATION])

    # -- each tick -------------------------------------------------------------------------------------
    def read(self, p: Any, out: dict[str, Reading]) -> None:
        """GPM tensor activity since the previous tick into ``out``. Raises the probe's ``Lost`` for a lost
        GPU."""
        nv = p.nv
        if self._gpm is not None and self.channel is not None:
            cid = self.channel.id
            try:
                p.call("nvmlGpmSampleGet", self._gpm[1])
                if self._gpm_ready:
                    mg = nv.c_nvmlGpmMetricsGet_t()
                    mg.version, mg.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, 1
                    mg.sample1, mg.sample2 = self._gpm[0], self._gpm[1]
                    mg.metrics[0].metricId = ANY_TENSOR_UTIL
                    nv.nvmlGpmMetricsGet(mg)
                    m = mg.metrics[0]
                    if m.nvmlReturn == nv.NVML_ERROR_INVALID_ARGUMENT:  # no time between the samples yet
                        out[cid] = Reading(cid, None, Status.STALE, "no time between two GPM samples")
                        return
                    ok = m.nvmlReturn == nv.NVML_SUCCESS
                    out[cid] = (Reading(cid, float(m.value)) if ok else
                                Reading(cid, None, Status.FAILED, p.names.get(m.nvmlReturn, "NVML error")))
                else:
                    out[cid] = Reading(cid, None, Status.STALE, "first GPM sample")
                self._gpm.reverse()
                self._gpm_ready = True
            except nv.NVMLError as exc:
                name = p.names.get(exc.value, f"NVML_ERROR_{exc.value}")
                out[cid] = Reading(cid, None, Status.FAILED, name)
                self._gpm_ready = False

    # -- the knob --------------------------------------------------------------------------------------
    def value(self, answering: bool = True) -> KnobValue:
        """The lock as this process set it; FAILED when the GPU does not answer (``answering`` False: its
        SM clock read failed this tick — NVML cannot read a lock back, so the clock read vouches)."""
        assert self.knob is not None and self.top_mhz is not None
        if not answering:
            return KnobValue(self.knob.id, None, None, Status.FAILED)
        locked = self.locked_mhz
        return KnobValue(self.knob.id, float(self.top_mhz if locked is None else locked),
                         "auto" if locked is None else "manual")  # the driver's own boost, or locked

    def write(self, do: Any, value: float) -> None:
        """Lock the SM clock to [floor, ``value``] MHz; at or above the top, reset the lock. ``do`` is the
        backend's NVML call wrapper (its errors: OutOfRange, NoPermission, NotSupported, …)."""
        assert self.knob is not None and self.top_mhz is not None
        if value >= self.top_mhz:
            do(f"{self.knob.id} := unlocked", "nvmlDeviceResetGpuLockedClocks")
            self.locked_mhz = None
        else:
            do(f"{self.knob.id} := {value:g} MHz", "nvmlDeviceSetGpuLockedClocks", self.floor_mhz, int(value))
            self.locked_mhz = float(int(value))

    def save(self) -> dict[str, Any]:
        return {"locked_mhz": self.locked_mhz}

    def restore(self, do: Any, saved: dict[str, Any]) -> None:
        locked = saved.get("locked_mhz")
        self.write(do, float(self.top_mhz if locked is None else locked))  # type: ignore[arg-type]

    def close(self, nv: Any) -> None:
        for sample in self._gpm or ():
            try:
                nv.nvmlGpmSampleFree(sample)
            except nv.NVMLError:
                pass
        self._gpm = None


def close_all(readers: Any, nv: Any) -> None:
    """Free every reader's GPM sample buffers (before nvmlShutdown); closing never fails."""
    for reader in readers:
        try:
            reader.extra.close(nv)
        except Exception:  # noqa: BLE001 - closing must not fail
            pass
