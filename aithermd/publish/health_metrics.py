"""Health you can alert on: GPUs up, expected and present, NVML initialised, RAPL energy readable, power
limits capped or exceeded, the udev monitor and the D-Bus connection.

Rendered from the latest snapshot's ``health`` (what the backends reported: :mod:`aithermd.backends.
nvml_life`, :mod:`aithermd.actuate.caps`), its devices, and the services' own state in
``StateHub.status`` (``"udev"``: restarts, rescans; ``"dbus"``: connected, reconnects). Every counter is
there at 0 from the moment its source is known, so an alert fires on the first event. GPU series carry
``gpu`` (the NVML index at first sight, as dcgm-exporter's ``gpu``), ``uuid`` and ``pci_bus_id``.

- ``aithermd_gpu_up{gpu,uuid,pci_bus_id}``: 1 while the GPU answers, 0 while lost, down (NVML must be
  initialised again) or hung;
- ``aithermd_gpus_expected`` (every GPU seen since the start, and those NVML counts but cannot hand out yet)
  and ``aithermd_gpus_present`` (those answering now);
- ``aithermd_nvml_up``, ``aithermd_nvml_reinits_total``, ``aithermd_nvml_init_failures_total``;
- ``aithermd_gpus_released`` (0 from the start) and ``aithermd_gpu_released{uuid,pci_bus_id}``: GPUs let go
  (``ReleaseGpu``, a udev remove or unbind), unwatched by any rule until adopted again (attack6 G4);
- ``aithermd_gpu_energy_estimated{gpu,uuid,pci_bus_id}``: 1 when the GPU's energy is integrated from power;
- ``aithermd_gpu_power_capped{knob,by}``: 1 while the enforced limit is below the requested one;
  ``aithermd_gpu_power_above_limit_total{knob}``: draws above the enforced limit for 30 s;
- ``aithermd_rapl_energy_available{zone}``: 0 while a zone's ``energy_uj`` cannot be read;
- ``aithermd_udev_monitor_restarts_total``, ``aithermd_udev_rescans_total``;
- ``aithermd_dbus_connected``, ``aithermd_dbus_reconnects_total``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from aithermd.model import DeviceKind, Event, KnobKind, Quantity, Snapshot, Status
from aithermd.publish.textfam import PROM, TextCollector

GPU_LABELS = ["gpu", "uuid", "pci_bus_id"]


class AboveLimitCounter:
    """``power`` events (a draw above the enforced limit) per knob, at 0 for every GPU power limit known.
    A hub listener on the loop thread; the dict is replaced, never mutated once shared."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._devices: Any = None

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        counts = None
        if snapshot.devices is not self._devices:
            self._devices = snapshot.devices
            counts = {k.id: self.counts.get(k.id, 0) for d in snapshot.devices for k in d.knobs
                      if k.kind is KnobKind.POWER_LIMIT}
        for e in events:
            if e.kind == "power" and e.data.get("why") == "draw_above_enforced":
                counts = dict(self.counts) if counts is None else counts
                counts[e.subject] = counts.get(e.subject, 0) + 1
        if counts is not None:
            self.counts = counts


class HealthCollector(TextCollector):
    """The families of the module doc, from ``hub.latest`` and ``hub.status``."""

    def __init__(self, hub: Any, above: AboveLimitCounter) -> None:
        self._hub = hub
        self._above = above

    def inputs(self) -> tuple[Any, ...]:
        """What the text is made of, compared by value: the snapshot's devices, health and degraded ids,
        its RAPL energy readings' status, the above-limit counts, the services' status entries."""
        s = self._hub.latest
        status = [x for kv in list(getattr(self._hub, "status", {}).items()) for x in kv]
        if s is None:
            return (None, self._above.counts, *status)
        rapl = [getattr(s.readings.get(f"{d.id}/energy"), "status", None) for d in s.devices
                if d.kind is DeviceKind.POWERCAP]
        return (s.devices, s.health, s.degraded, tuple(rapl), self._above.counts, *status)

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        snapshot = self._hub.latest
        if snapshot is not None:
            yield from self._gpus(snapshot, f)
            yield from self._limits(snapshot, f)
            yield from self._rapl(snapshot, f)
        yield from self._services(getattr(self._hub, "status", {}), f)

    def _gpus(self, s: Snapshot, f: Any) -> Iterator[Any]:
        nvml = s.health.get("nvml")
        gpus = [d for d in s.devices if d.kind is DeviceKind.GPU]
        if nvml is None and not gpus:
            return
        states = (nvml or {}).get("gpus", {})
        up = f.gauge("aithermd_gpu_up", "1 while the GPU answers NVML; 0 while lost, down or hung.",
                     labels=GPU_LABELS)
        estimated = f.gauge("aithermd_gpu_energy_estimated", "1 when the GPU has no energy counter "
                            "(pre-Volta) and its energy is integrated from its power.",
                            labels=GPU_LABELS)
        degraded = set(s.degraded)
        for d in gpus:
            info = d.info
            labels = [d.id.removeprefix("gpu"), str(info.get("uuid", "")), str(info.get("pci_bus_id", ""))]
            state = states.get(d.id, {}).get("state")
            up.add_metric(labels, 1.0 if (state == "ok" if state else d.id not in degraded) else 0.0)
            energy = [c for c in d.channels if c.quantity is Quantity.ENERGY]
            if energy:
                estimated.add_metric(labels, 1.0 if energy[0].estimated else 0.0)
        yield up
        yield estimated
        if nvml is None:
            return
        for name, help_, value in (
                ("aithermd_gpus_expected", "GPUs expected: every GPU seen since the start, and those NVML "
                 "counts but cannot hand out yet.", nvml.get("expected", 0)),
                ("aithermd_gpus_present", "GPUs answering NVML now.", nvml.get("present", 0)),
                ("aithermd_nvml_up", "1 while NVML is initialised.",
                 1.0 if nvml.get("library") == "up" else 0.0)):
            g = f.gauge(name, help_)
            g.add_metric([], float(value))
            yield g
        released = nvml.get("released") or {}
        count = f.gauge("aithermd_gpus_released", "GPUs let go (ReleaseGpu, a udev remove or unbind): "
                        "unwatched, no safety rule on them, until adopted again.")
        count.add_metric([], float(len(released)))
        yield count
        each = f.gauge("aithermd_gpu_released", "1 for each GPU let go and unwatched (its gpu series are "
                       "gone from this page meanwhile).", labels=["uuid", "pci_bus_id"])
        for uuid, bus in released.items():
            each.add_metric([str(uuid), str(bus)], 1.0)
        yield each
        for name, help_, key in (("aithermd_nvml_reinits", "Times NVML was initialised again after it broke.",
                                  "reinits"),
                                 ("aithermd_nvml_init_failures", "nvmlInit calls that failed.",
                                  "init_failures")):
            c = f.counter(name, help_)
            c.add_metric([], float(nvml.get(key, 0)))
            yield c

    def _limits(self, s: Snapshot, f: Any) -> Iterator[Any]:
        capped = f.gauge("aithermd_gpu_power_capped", "1 while the enforced power limit is below "
                         "the requested one; by: its likely cause.", labels=["knob", "by"])
        for knob, st in (s.health.get("power_limits") or {}).items():
            if st.get("capped_by"):
                capped.add_metric([knob, str(st["capped_by"])], 1.0)
        yield capped
        above = f.counter("aithermd_gpu_power_above_limit", "Draws above the enforced power limit "
                          "for 30 s (each one also rewrites the requested limit once).",
                          labels=["knob"])
        for knob, n in self._above.counts.items():
            above.add_metric([knob], float(n))
        yield above

    def _rapl(self, s: Snapshot, f: Any) -> Iterator[Any]:
        available = f.gauge("aithermd_rapl_energy_available", "1 while the zone's energy_uj can be "
                            "read (it is root-only since CVE-2020-8694).", labels=["zone"])
        found = False
        for d in s.devices:
            if d.kind is not DeviceKind.POWERCAP:
                continue
            found = True
            r = s.readings.get(f"{d.id}/energy")
            ok = "energy_why_not" not in d.info and r is not None and r.status is Status.OK
            available.add_metric([d.id.removeprefix("powercap:")], 1.0 if ok else 0.0)
        if found:
            yield available

    @staticmethod
    def _services(status: dict[str, dict[str, Any]], f: Any) -> Iterator[Any]:
        udev = status.get("udev")
        if udev is not None:
            for name, help_, key in (
                    ("aithermd_udev_monitor_restarts", "Restarts of the udev monitor after it failed.",
                     "restarts"),
                    ("aithermd_udev_rescans", "Rescans of every device family (periodic, and after a monitor "
                     "restart).", "rescans")):
                c = f.counter(name, help_)
                c.add_metric([], float(udev.get(key, 0)))
                yield c
        dbus = status.get("dbus")
        if dbus is not None:
            g = f.gauge("aithermd_dbus_connected", "1 while the daemon holds its D-Bus name.")
            g.add_metric([], 1.0 if dbus.get("connected") else 0.0)
            yield g
            c = f.counter("aithermd_dbus_reconnects", "Times the D-Bus connection was made again "
                          "after the bus dropped it (dbus-daemon restarted).")
            c.add_metric([], float(dbus.get("reconnects", 0)))
            yield c
