"""Prometheus families of the energy accounting (:mod:`aithermd.accounting.export`): rendered at scrape
time from the service's frozen export, never from hardware.

- ``aithermd_energy_joules_total{device}`` — energy the accounting measured (``device``: ``gpu0``…,
  ``cpu`` for the RAPL packages); ``aithermd_energy_idle_joules_total{device}`` — the idle floor's part
  nobody was charged; ``aithermd_energy_unattributed_joules_total{device}`` — active energy with no process
  to charge.
- per consumer, bounded (top N plus ``other``): ``aithermd_unit_energy_joules_total{unit,device}``,
  ``aithermd_slurm_job_energy_joules_total{hpc_job,device}`` (``hpc_job`` as dcgm-exporter names it; the
  value is ``slurm:N``), ``aithermd_container_energy_joules_total{container_id,pod_uid,device}``,
  ``aithermd_process_energy_joules_total{pid,comm,device}``.
- ``aithermd_gpu_memory_used_bytes``, ``aithermd_gpu_memory_total_bytes``, ``aithermd_gpu_processes`` with
  the GPU labels of :mod:`aithermd.publish.metrics` (``gpu_index``, ``gpu_uuid``).

Every series above also carries dcgm-exporter's GPU labels, ``gpu`` (the index) and ``UUID``, as the
hardware families do (empty for ``cpu``): ``aithermd_energy_joules_total * on (UUID) group_left
DCGM_FI_DEV_GPU_UTIL`` joins without ``label_replace`` (attack8 T10). ``device`` stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aithermd.accounting.export import EnergyExport
from aithermd.publish.textfam import PROM, TextCollector

_FAMILIES = {  # kind → (metric, help, consumer labels)
    "unit": ("aithermd_unit_energy_joules", "Energy attributed to a systemd unit (top N, then other).",
             ["unit"]),
    "job": ("aithermd_slurm_job_energy_joules", "Energy attributed to a Slurm job (top N, then other).",
            ["hpc_job"]),
    "container": ("aithermd_container_energy_joules", "Energy attributed to a container (top N, then other).",
                  ["container_id", "pod_uid"]),
    "process": ("aithermd_process_energy_joules", "Energy attributed to a process (top N, then other).",
                ["pid", "comm"]),
}


def _dcgm(device: str, uuids: Mapping[str, str]) -> list[str]:
    """dcgm-exporter's ``gpu`` and ``UUID`` label values of ``device`` (empty for a non-GPU device)."""
    if not device.startswith("gpu"):
        return ["", ""]
    return [device.removeprefix("gpu"), uuids.get(device, "")]


class EnergyCollector(TextCollector):
    """``export()`` returns the service's latest :class:`EnergyExport`."""

    def __init__(self, export: Callable[[], EnergyExport]) -> None:
        self._export = export

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        e = self._export()
        uuids = e.uuids
        dl = ["device", "gpu", "UUID"]
        total = f.counter("aithermd_energy_joules", "Energy the accounting measured per device.", labels=dl)
        idle = f.counter("aithermd_energy_idle_joules", "Idle-floor energy charged to nobody.", labels=dl)
        unattributed = f.counter("aithermd_energy_unattributed_joules",
                                 "Active energy with no process to charge.", labels=dl)
        for device, t, i, u in e.devices:
            labels = [device, *_dcgm(device, uuids)]
            total.add_metric(labels, t)
            idle.add_metric(labels, i)
            unattributed.add_metric(labels, u)
        yield from (total, idle, unattributed)
        for kind, (name, help_, names) in _FAMILIES.items():
            family = f.counter(name, help_, labels=[*names, *dl])
            for values, device, joules in e.families.get(kind, ()):
                family.add_metric([*values, device, *_dcgm(device, uuids)], joules)
            yield family
        gl = ["gpu_index", "gpu_uuid", "gpu", "UUID"]
        used = f.gauge("aithermd_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=gl)
        size = f.gauge("aithermd_gpu_memory_total_bytes", "GPU memory in all (NVML).", labels=gl)
        procs = f.gauge("aithermd_gpu_processes", "Processes holding the GPU (NVML).", labels=gl)
        for device, uuid, u, t, n in e.gpus:
            labels = [device.removeprefix("gpu"), uuid, device.removeprefix("gpu"), uuid]
            if u is not None:
                used.add_metric(labels, float(u))
            if t is not None:
                size.add_metric(labels, float(t))
            procs.add_metric(labels, float(n))
        yield from (used, size, procs)
