"""Prometheus exporter: a custom collector that renders the LAST published snapshot.

No hardware is read at scrape time: :class:`SnapshotCollector` turns ``StateHub.latest`` into metric families
(base units, ``aithermd_`` prefix), so a device that vanished from the snapshot vanishes from the scrape.
Counters that need history (decisions, drift, faults) are kept by a hub listener on the event-loop thread
and published to the scrape thread copy-on-write (a dict is never mutated after it is shared).

Entry point: :func:`start` (``listen`` is ``"HOST:PORT"`` or ``"none"``) → :class:`MetricsHandle`; the
daemon calls ``handle.observe_tick(seconds)`` after each tick for ``aithermd_tick_duration_seconds``.
Metric names and labels follow the Prometheus naming guide (base units: seconds, watts, joules, celsius,
ratio); labels ``gpu_index``/``gpu_uuid``/``gpu_name``, ``chip``/``sensor``/``label``, ``zone``, ``knob``,
``policy``. ``chip`` is the device id's chip part: the lm-sensors name, with ``#2`` for a second chip of
the same name, so twin chips are two series.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aithermd import __version__
from aithermd.backends.nvml_probe import REASONS
from aithermd.model import Device, DeviceKind, Event, KnobKind, Layer, Quantity, Snapshot, Status
from aithermd.publish.budget_metrics import BudgetCollector
from aithermd.publish.document import decision_changes
from aithermd.publish.health_metrics import AboveLimitCounter, HealthCollector
from aithermd.publish.hub import StateHub
from aithermd.publish.scrape import CLIENT_TIMEOUT_S, Exposition, ScrapeServer

# Loopback, outside the 9090–9999 range Prometheus allocates to its own components and to exporters.
DEFAULT_METRICS_LISTEN = "127.0.0.1:8736"
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# NVML clocks-event reasons always rendered (0 or 1), so a reason that clears reads 0 instead of vanishing.
CLOCK_EVENT_REASONS = tuple(name for _, name in REASONS)

# GPU series also carry dcgm-exporter's own names for the index and UUID (``gpu``, ``UUID``), so
# `aithermd_gpu_power_watts * on (UUID) group_left DCGM_FI_DEV_GPU_UTIL` joins without label_replace.
_GPU_LABELS = ["gpu_index", "gpu_uuid", "gpu_name", "gpu", "UUID"]
# hwmon series: the lm-sensors chip name (with #2 for a twin), node_exporter's hwmon chip name (``node_chip``, its ``chip`` label:
# bus type and device, e.g. platform_nct6775_656) and sensor (tempN, fanN, the same in both), the label or
# else the sensor name.
_HWMON_LABELS = ["chip", "node_chip", "sensor", "label"]
_NODE_CHIP_INVALID = re.compile(r"[^a-z0-9:_]")
_GPU_GAUGES = {  # channel attribute → (metric, help, scale)
    "temperature": ("aithermd_gpu_temperature_celsius", "GPU core temperature (NVML).", 1.0),
    "memory_temperature": ("aithermd_gpu_memory_temperature_celsius", "GPU memory temperature (NVML).", 1.0),
    "power": ("aithermd_gpu_power_watts", "GPU power draw (NVML).", 1.0),
    "utilization": ("aithermd_gpu_utilization_ratio", "GPU utilisation, 0–1 (NVML).", 0.01),
    "sm_clock": ("aithermd_gpu_sm_clock_hertz", "GPU SM clock (NVML).", 1e6),
    "memory_clock": ("aithermd_gpu_memory_clock_hertz", "GPU memory clock (NVML).", 1e6),
}


def node_exporter_chip(dev: Device) -> str:
    """node_exporter's hwmon ``chip`` label for ``dev`` (collector/hwmon_linux.go, hwmonName): the device's
    bus directory and name, each lower-cased with characters outside ``[a-z0-9:_]`` made ``_``
    (``devices/platform/nct6775.656`` → ``platform_nct6775_656``); for a chip with no device link, its
    name."""
    def clean(text: str) -> str:
        return _NODE_CHIP_INVALID.sub("_", text.strip().lower()).strip("_")

    parts = str(dev.info.get("bus_path", "")).split("/")
    if len(parts) >= 2 and not parts[-1].startswith("hwmon") and parts[:2] != ["devices", "virtual"]:
        kind, name = clean(parts[-2]), clean(parts[-1])
        if kind and name:
            return f"{kind}_{name}"
    return clean(dev.name)


def _gpu_labels(dev: Device) -> list[str]:
    uuid = str(dev.info.get("uuid", ""))
    index = dev.id.removeprefix("gpu")
    return [index, uuid, dev.name, index, uuid]


def _ok(snapshot: Snapshot, channel_id: str) -> float | None:
    r = snapshot.readings.get(channel_id)
    return r.value if r is not None and r.status is Status.OK else None


class EventCounters:
    """Decision, drift and fault counters, fed by a hub listener (event-loop thread).

    ``decisions``: {(knob, rule): n} counts changes of a knob's winning decision (rule or value);
    ``drift``: {knob: n} counts ``drift``/``conflict`` events; ``faults``: {device: n} counts ``fault``
    events.
    ``drift`` and ``faults`` hold every knob and device of the snapshot from the first one it appears in
    (start or hotplug), at 0 until its first event, so ``increase()`` and ``rate()`` see that first event
    (a series born at 1 increases by nothing). Entries of knobs and devices no longer in the snapshot are
    dropped. Each dict is replaced, never mutated,
    once published, so the scrape thread reads a consistent copy without a lock.
    """

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], int] = {}
        self.drift: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self._previous: Snapshot | None = None

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        changed = decision_changes(self._previous, snapshot)
        if changed:
            decisions = dict(self.decisions)
            for d in changed:
                decisions[(d.knob_id, d.rule)] = decisions.get((d.knob_id, d.rule), 0) + 1
            self.decisions = decisions
        drift, faults = None, None
        for e in events:
            if e.kind in ("drift", "conflict"):
                drift = dict(self.drift) if drift is None else drift
                drift[e.subject] = drift.get(e.subject, 0) + 1
            elif e.kind == "fault":
                device = str(e.data.get("device") or e.subject.split("/", 1)[0])
                faults = dict(self.faults) if faults is None else faults
                faults[device] = faults.get(device, 0) + 1
        if drift is not None:
            self.drift = drift
        if faults is not None:
            self.faults = faults
        if self._previous is None or self._previous.devices is not snapshot.devices:
            self._follow_devices(snapshot)
        self._previous = snapshot

    def _follow_devices(self, snapshot: Snapshot) -> None:
        """Counters for exactly the snapshot's devices and knobs: new ones at 0, vanished ones dropped."""
        devices = [d.id for d in snapshot.devices]
        knobs = [k.id for d in snapshot.devices for k in d.knobs]
        self.decisions = {k: v for k, v in self.decisions.items() if k[0] in set(knobs)}
        self.drift = {k: self.drift.get(k, 0) for k in knobs}
        self.faults = {d: self.faults.get(d, 0) for d in devices}


class SnapshotCollector(Collector):
    """Renders ``hub.latest`` and the :class:`EventCounters` as metric families (see the module doc)."""

    def __init__(self, hub: StateHub, counters: EventCounters) -> None:
        self._hub = hub
        self._counters = counters

    def describe(self) -> list[Metric]:
        return []  # families depend on the snapshot: never collect at registration time

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily("aithermd_build_info", "aithermd build information.", labels=["version"])
        build.add_metric([__version__], 1.0)
        yield build
        snapshot = self._hub.latest
        if snapshot is None:
            return
        yield from self._gpu(snapshot)
        yield from self._hwmon(snapshot)
        yield from self._powercap(snapshot)
        yield from self._policy(snapshot)
        yield from self._events(snapshot)

    def _gpu(self, s: Snapshot) -> Iterator[Metric]:
        gauges = {attr: GaugeMetricFamily(name, help_, labels=_GPU_LABELS)
                  for attr, (name, help_, _) in _GPU_GAUGES.items()}
        limit = GaugeMetricFamily("aithermd_gpu_power_limit_watts", "GPU power management limit (NVML).",
                                  labels=_GPU_LABELS)
        enforced = GaugeMetricFamily("aithermd_gpu_enforced_power_limit_watts",
                                     "GPU enforced power limit (NVML).", labels=_GPU_LABELS)
        energy = CounterMetricFamily("aithermd_gpu_energy_joules", "GPU energy since driver load (NVML).",
                                     labels=_GPU_LABELS)
        reasons = GaugeMetricFamily("aithermd_gpu_clock_event_reason",
                                    "1 while NVML reports this clocks-event (throttle) reason.",
                                    labels=[*_GPU_LABELS, "reason"])
        held = GaugeMetricFamily("aithermd_gpu_held_idle_excess_watts",
                                 "Power a GPU with no work draws above its idle floor while held high for a "
                                 "minute (a process holding a context, a stuck P-state); 0 otherwise.",
                                 labels=_GPU_LABELS)
        for dev in s.devices:
            if dev.kind is not DeviceKind.GPU:
                continue
            labels = _gpu_labels(dev)
            for ch in dev.channels:
                value = _ok(s, ch.id)
                if value is None:
                    continue
                if ch.attribute in gauges:
                    gauges[ch.attribute].add_metric(labels, value * _GPU_GAUGES[ch.attribute][2])
                elif ch.quantity is Quantity.ENERGY:
                    energy.add_metric(labels, value)
            for knob in dev.knobs:
                kv = s.knobs.get(knob.id)
                if knob.kind is KnobKind.POWER_LIMIT and kv is not None and kv.value is not None:
                    limit.add_metric(labels, kv.value)
                    if "enforced_w" in kv.extra:
                        enforced.add_metric(labels, kv.extra["enforced_w"])
            attrs = s.attrs.get(dev.id, MappingProxyType({}))
            held.add_metric(labels, float((attrs.get("held_idle") or {}).get("excess_w", 0.0)))
            if "clock_event_reasons" in attrs:
                active = set(attrs["clock_event_reasons"])
                for reason in sorted(active.union(CLOCK_EVENT_REASONS)):
                    reasons.add_metric([*labels, reason], 1.0 if reason in active else 0.0)
        yield from gauges.values()
        yield from (limit, enforced, energy, reasons, held)

    def _hwmon(self, s: Snapshot) -> Iterator[Metric]:
        temps = GaugeMetricFamily("aithermd_temperature_celsius", "hwmon temperature (tempN_input).",
                                  labels=_HWMON_LABELS)
        zones = GaugeMetricFamily("aithermd_thermal_zone_temperature_celsius",
                                  "Thermal zone temperature (class/thermal thermal_zoneN/temp).",
                                  labels=["zone", "type"])
        fans = GaugeMetricFamily("aithermd_fan_speed_rpm", "hwmon fan speed (fanN_input).",
                                 labels=_HWMON_LABELS)
        # the fan's own labels (chip, node_chip, sensor fanN, label), so duty and RPM join on them
        duty = GaugeMetricFamily("aithermd_fan_duty_ratio", "Fan duty, 0–1 (hwmon pwmN/255, NVML fan "
                                 "speed).", labels=["knob", *_HWMON_LABELS])
        for dev in s.devices:
            hwmon = dev.kind is DeviceKind.HWMON
            # the unique id's chip part: twin chips (two acpitz-acpi-0) are chip and chip#2, so Prometheus
            # never sees two series with the same labels
            chip = dev.id.removeprefix("hwmon:") if hwmon else dev.id
            node_chip = node_exporter_chip(dev) if hwmon else ""
            channels = {ch.id: ch for ch in dev.channels}
            if hwmon:
                for ch in dev.channels:
                    family = (temps if ch.quantity is Quantity.TEMPERATURE
                              else fans if ch.quantity is Quantity.FAN else None)
                    value = _ok(s, ch.id) if family is not None else None
                    if value is not None:
                        family.add_metric([chip, node_chip, ch.attribute, ch.label or ch.attribute], value)
            elif dev.kind is DeviceKind.THERMAL:
                for ch in dev.channels:
                    value = _ok(s, ch.id)
                    if value is not None:
                        zones.add_metric([dev.id.removeprefix("thermal:"), dev.name], value)
            for knob in dev.knobs:
                if knob.kind in (KnobKind.PWM, KnobKind.FAN):
                    kv = s.knobs.get(knob.id)
                    if kv is not None and kv.value is not None:
                        fan = channels.get(knob.fan_channel or "")
                        sensor = fan.attribute if fan is not None else knob.id.rsplit("/", 1)[-1]
                        label = knob.label or (fan.label if fan is not None else None) or sensor
                        duty.add_metric([knob.id, chip, node_chip, sensor, label], kv.value / 100.0)
        yield from (temps, zones, fans, duty)

    def _powercap(self, s: Snapshot) -> Iterator[Metric]:
        # One series per zone: CPU package power is aithermd_rapl_power_watts{zone=~"package-.*"} (core,
        # uncore, dram and psys are not packages); no second family repeats it.
        power = GaugeMetricFamily("aithermd_rapl_power_watts",
                                  "RAPL zone power over the last tick (powercap energy_uj).", labels=["zone"])
        energy = CounterMetricFamily("aithermd_rapl_energy_joules", "RAPL zone energy counter (powercap).",
                                     labels=["zone"])
        limits = GaugeMetricFamily("aithermd_rapl_power_limit_watts", "RAPL power cap (PL1 long_term, PL2 "
                                   "short_term).", labels=["zone", "constraint"])
        for dev in s.devices:
            if dev.kind is not DeviceKind.POWERCAP:
                continue
            zone = dev.id.removeprefix("powercap:")
            for ch in dev.channels:
                value = _ok(s, ch.id)
                if value is not None and ch.quantity is Quantity.POWER:
                    power.add_metric([zone], value)
                elif value is not None and ch.quantity is Quantity.ENERGY:
                    energy.add_metric([zone], value)
            for knob in dev.knobs:
                kv = s.knobs.get(knob.id)
                # 0 µW is "no limit set" (a core or uncore zone's PL1), not a cap of 0 W
                if knob.kind in (KnobKind.PL1, KnobKind.PL2) and kv is not None and kv.value:
                    limits.add_metric([zone, str(knob.kind)], kv.value)
        yield from (power, energy, limits)

    def _policy(self, s: Snapshot) -> Iterator[Metric]:
        active = GaugeMetricFamily("aithermd_policy_active", "1 for the active policy.", labels=["policy"])
        if s.policy.active:
            active.add_metric([s.policy.active], 1.0)
        holds = GaugeMetricFamily("aithermd_policy_holds", "Holds on top of the active policy.",
                                  labels=["policy"])
        per_policy: dict[str, int] = {}
        for h in s.policy.holds:
            per_policy[h.policy] = per_policy.get(h.policy, 0) + 1
        for policy, n in sorted(per_policy.items()):
            holds.add_metric([policy], float(n))
        failsafe = GaugeMetricFamily("aithermd_failsafe_active", "1 while the safety layer drives this knob.",
                                     labels=["knob"])
        for knob_id, d in s.decisions.items():
            failsafe.add_metric([knob_id], 1.0 if d.layer is Layer.SAFETY else 0.0)
        degraded = GaugeMetricFamily("aithermd_degraded", "1 for each device, channel or knob in trouble.",
                                     labels=["id"])
        for item in s.degraded:
            degraded.add_metric([item], 1.0)
        stamp = GaugeMetricFamily("aithermd_snapshot_timestamp_seconds",
                                  "Wall-clock time of the snapshot these metrics render.")
        stamp.add_metric([], s.t_wall)
        yield from (active, holds, failsafe, degraded, stamp)

    def _events(self, s: Snapshot) -> Iterator[Metric]:
        c = self._counters
        decisions = CounterMetricFamily("aithermd_decisions", "Changes of a knob's winning decision.",
                                        labels=["knob", "rule"])
        for (knob, rule), n in c.decisions.items():
            decisions.add_metric([knob, rule], float(n))
        drift = CounterMetricFamily("aithermd_drift", "Drift and conflict events per knob.", labels=["knob"])
        for knob, n in c.drift.items():
            drift.add_metric([knob], float(n))
        faults = CounterMetricFamily("aithermd_faults", "Fault events per device.", labels=["device"])
        for device, n in c.faults.items():
            faults.add_metric([device], float(n))
        yield from (decisions, drift, faults)


def parse_listen(listen: str) -> tuple[str, int] | None:
    """``"HOST:PORT"`` (IPv6 as ``"[::1]:PORT"``) → (host, port); ``"none"`` → None. Raises ValueError."""
    if listen.strip().lower() in ("none", ""):
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics listen address {listen!r}: expected HOST:PORT or 'none'")
    return host.strip("[]") or "127.0.0.1", int(port)


class MetricsHandle:
    """A running exporter (or none): ``registry``, ``collector``, ``address`` (host, port) or None,
    ``observe_tick(seconds)``, ``stop()``."""

    def __init__(self, hub: StateHub) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.exposition = out = Exposition(self.registry)  # a collector's text kept while its inputs hold
        self.counters = c = EventCounters()
        self.collector = out.add(SnapshotCollector(hub, c),
                                 lambda: (hub.latest, c.decisions, c.drift, c.faults))
        out.add(BudgetCollector(hub), lambda: (hub.latest,))
        # process_* (CPU seconds, resident memory, fds, start time) and python_info, as every client has them
        out.add(ProcessCollector(registry=None))
        out.add(PlatformCollector(registry=None), tuple)  # the interpreter's version: never changes
        self.above_limit = above = AboveLimitCounter()  # GPU health, NVML, RAPL availability, udev, D-Bus
        out.add(HealthCollector(hub, above),  # hub.status: each service replaces its entry, never mutates it
                lambda: (hub.latest, above.counts, *(x for kv in list(hub.status.items()) for x in kv)))
        self._tick = out.add(Histogram("aithermd_tick_duration_seconds", "Duration of one control-loop tick.",
                                       buckets=TICK_BUCKETS_S, registry=None), lambda: (self.ticks,))
        from aithermd.publish.fan_metrics import FanCollector, StallCounter

        stalls = StallCounter()
        out.add(FanCollector(hub, stalls), lambda: (hub.latest, stalls.stalls))
        self._remove_listeners = (hub.add_listener(self.counters.on_publish),
                                  hub.add_listener(self.above_limit.on_publish),
                                  hub.add_listener(stalls.on_publish))
        self._server: ScrapeServer | None = None
        self.address: tuple[str, int] | None = None
        self.ticks = 0  # ticks observed (a new int object at each: the histogram's text is kept until then)

    def observe_tick(self, seconds: float) -> None:
        """Record one tick's duration (s) in ``aithermd_tick_duration_seconds``."""
        self._tick.observe(seconds)
        self.ticks += 1

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` (:class:`~aithermd.publish.scrape.ScrapeServer`: one thread, asleep until a
        scraper connects, one request at a time, a client gets ``CLIENT_TIMEOUT_S`` to send its request),
        always in the classic text format (0.0.4: Prometheus accepts it, and it renders in two thirds of the
        time of OpenMetrics)."""
        self._server = ScrapeServer(host, port, lambda: render(self))
        self.address = self._server.address

    def stop(self) -> None:
        """Stop serving and detach from the hub; safe to call twice."""
        for remove in self._remove_listeners:
            remove()
        if self._server is not None:
            self._server.stop()
            self._server = None


def start(listen: str, hub: StateHub, energy: Any = None) -> MetricsHandle:
    """Serve ``/metrics`` on ``listen`` (``"HOST:PORT"``, port 0 picks a free one; ``"none"`` serves nothing
    but still counts, so ``observe_tick`` always works). ``energy``: the daemon's energy service, whose
    accounting families (:mod:`aithermd.publish.energy_metrics`) are added. Raises ValueError for a
    malformed address and OSError when the port cannot be had (the daemon turns both into a warning)."""
    handle = MetricsHandle(hub)
    if energy is not None:
        from aithermd.publish.energy_metrics import EnergyCollector

        export = lambda: energy.exporter.export  # noqa: E731 - replaced, never mutated, at each pass
        handle.exposition.add(EnergyCollector(export), lambda: (export(),))
    address = parse_listen(listen)
    if address is not None:
        try:
            handle.serve(*address)
        except BaseException:
            handle.stop()
            raise
    return handle


def render(handle: MetricsHandle) -> bytes:
    """The text exposition of the handle's registry (what a scrape returns; the bytes
    ``prometheus_client.generate_latest`` would give), each collector's text kept while its inputs hold."""
    return handle.exposition.render()


__all__: Sequence[Any] = ("CLIENT_TIMEOUT_S", "DEFAULT_METRICS_LISTEN", "MetricsHandle", "SnapshotCollector", "EventCounters",
                          "parse_listen", "render", "start")
