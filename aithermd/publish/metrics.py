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

from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, PlatformCollector

from aithermd import __version__
from aithermd.backends.nvml_probe import REASONS
from aithermd.model import Device, DeviceKind, KnobKind, Layer, Quantity, Snapshot, Status
from aithermd.publish.budget_metrics import BudgetCollector
from aithermd.publish.event_counters import EventCounters
from aithermd.publish.health_metrics import AboveLimitCounter, HealthCollector
from aithermd.publish.hub import StateHub
from aithermd.publish.scrape import CLIENT_TIMEOUT_S, Ahead, Exposition, ScrapeServer, parse_listen
from aithermd.publish.series_labels import HWMON_LABELS, hwmon_rows, node_exporter_chip
from aithermd.publish.textfam import PROM, ProcessFigures, TextCollector, TickHistogram

# Loopback, outside the 9090–9999 range Prometheus allocates to its own components and to exporters.
DEFAULT_METRICS_LISTEN = "127.0.0.1:8736"
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# NVML clocks-event reasons always rendered (0 or 1), so a reason that clears reads 0 instead of vanishing.
CLOCK_EVENT_REASONS = tuple(name for _, name in REASONS)

# GPU series also carry dcgm-exporter's own names for the index and UUID (``gpu``, ``UUID``), so
# `aithermd_gpu_power_watts * on (UUID) group_left DCGM_FI_DEV_GPU_UTIL` joins without label_replace.
_GPU_LABELS = ["gpu_index", "gpu_uuid", "gpu_name", "gpu", "UUID"]
_GPU_GAUGES = {  # channel attribute → (metric, help, scale)
    "temperature": ("aithermd_gpu_temperature_celsius", "GPU core temperature (NVML).", 1.0),
    "memory_temperature": ("aithermd_gpu_memory_temperature_celsius", "GPU memory temperature (NVML).", 1.0),
    "power": ("aithermd_gpu_power_watts", "GPU power draw (NVML).", 1.0),
    "utilization": ("aithermd_gpu_utilization_ratio", "GPU utilisation, 0–1 (NVML).", 0.01),
    "sm_clock": ("aithermd_gpu_sm_clock_hertz", "GPU SM clock (NVML).", 1e6),
    "memory_clock": ("aithermd_gpu_memory_clock_hertz", "GPU memory clock (NVML).", 1e6),
}


def _gpu_labels(dev: Device) -> list[str]:
    uuid = str(dev.info.get("uuid", ""))
    index = dev.id.removeprefix("gpu")
    return [index, uuid, dev.name, index, uuid]


def _ok(snapshot: Snapshot, channel_id: str) -> float | None:
    r = snapshot.readings.get(channel_id)
    return r.value if r is not None and r.status is Status.OK else None


class SnapshotCollector(TextCollector):
    """Renders ``hub.latest`` and the :class:`EventCounters` as metric families (see the module doc).

    ``part`` (one of :data:`PARTS`, or all of them): the build info and GPUs, hwmon and thermal zones, RAPL,
    the policy and safety state, the snapshot's time, the event counters. The exporter registers each part
    on its own with its own ``inputs()``, so a scrape renders again only those whose inputs changed since
    the last one (the readings and the time at each tick; the GPU and RAPL families only where there are
    such devices: without, their text is their headers) and keeps the others' text."""

    PARTS = ("gpu", "hwmon", "powercap", "policy", "stamp", "events")
    _KINDS = {"gpu": DeviceKind.GPU, "powercap": DeviceKind.POWERCAP}

    def __init__(self, hub: StateHub, counters: EventCounters, part: str = "all") -> None:
        self._hub = hub
        self._counters = counters
        self.part = part
        self._devices: Any = None
        self._none = False  # no device of the part's kind in self._devices

    def inputs(self) -> tuple[Any, ...]:
        """What the part's text is made of (compared by value: see :class:`~aithermd.publish.scrape.
        Exposition`)."""
        s, part, c = self._hub.latest, self.part, self._counters
        if part == "events":
            return (s is None, c.decisions, c.drift, c.faults)
        if s is None:
            return (None,)
        if part == "policy":
            return (s.policy.active, s.policy.holds, s.degraded, tuple(s.decisions),
                    tuple([d.layer is Layer.SAFETY for d in s.decisions.values()]))
        kind = self._KINDS.get(part)
        if kind is not None:
            if s.devices is not self._devices:
                self._devices, self._none = s.devices, all(d.kind is not kind for d in s.devices)
            if self._none:
                return ("none",)
        return (s,)

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        part = self.part
        whole = part == "all"
        if whole or part == "gpu":
            build = f.gauge("aithermd_build_info", "aithermd build information.", labels=["version"])
            build.add_metric([__version__], 1.0)
            yield build
        snapshot = self._hub.latest
        if snapshot is None:
            return
        if whole or part == "gpu":
            yield from self._gpu(snapshot, f)
        if whole or part == "hwmon":
            yield from self._hwmon(snapshot, f)
        if whole or part == "powercap":
            yield from self._powercap(snapshot, f)
        if whole or part == "policy":
            yield from self._policy(snapshot, f)
        if whole or part == "stamp":
            stamp = f.gauge("aithermd_snapshot_timestamp_seconds",
                            "Wall-clock time of the snapshot these metrics render.")
            stamp.add_metric([], snapshot.t_wall)
            yield stamp
        if whole or part == "events":
            yield from self._events(snapshot, f)

    def _gpu(self, s: Snapshot, f: Any) -> Iterator[Any]:
        gauges = {attr: f.gauge(name, help_, labels=_GPU_LABELS)
                  for attr, (name, help_, _) in _GPU_GAUGES.items()}
        limit = f.gauge("aithermd_gpu_power_limit_watts", "GPU power management limit (NVML).",
                        labels=_GPU_LABELS)
        enforced = f.gauge("aithermd_gpu_enforced_power_limit_watts",
                           "GPU enforced power limit (NVML).", labels=_GPU_LABELS)
        energy = f.counter("aithermd_gpu_energy_joules", "GPU energy since driver load (NVML).",
                           labels=_GPU_LABELS)
        reasons = f.gauge("aithermd_gpu_clock_event_reason",
                          "1 while NVML reports this clocks-event (throttle) reason.",
                          labels=[*_GPU_LABELS, "reason"])
        held = f.gauge("aithermd_gpu_held_idle_excess_watts",
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

    def _hwmon(self, s: Snapshot, f: Any) -> Iterator[Any]:
        temps = f.gauge("aithermd_temperature_celsius", "hwmon temperature (tempN_input).",
                        labels=HWMON_LABELS)
        zones = f.gauge("aithermd_thermal_zone_temperature_celsius",
                        "Thermal zone temperature (class/thermal thermal_zoneN/temp).",
                        labels=["zone", "type"])
        fans = f.gauge("aithermd_fan_speed_rpm", "hwmon fan speed (fanN_input).",
                       labels=HWMON_LABELS)
        duty = f.gauge("aithermd_fan_duty_ratio", "Fan duty, 0–1 (hwmon pwmN/255, NVML fan "
                       "speed).", labels=["knob", *HWMON_LABELS])
        families, readings, knobs, ok = (temps, zones, fans), s.readings, s.knobs, Status.OK
        for dev in s.devices:
            rows, duties = hwmon_rows(dev)
            for i, cid, labels in rows:
                r = readings.get(cid)
                if r is not None and r.status is ok and r.value is not None:
                    families[i].add_metric(labels, r.value)
            for kid, labels in duties:
                kv = knobs.get(kid)
                if kv is not None and kv.value is not None:
                    duty.add_metric(labels, kv.value / 100.0)
        yield from (temps, zones, fans, duty)

    def _powercap(self, s: Snapshot, f: Any) -> Iterator[Any]:
        # One series per zone: CPU package power is aithermd_rapl_power_watts{zone=~"package-.*"} (core,
        # uncore, dram and psys are not packages); no second family repeats it.
        power = f.gauge("aithermd_rapl_power_watts",
                        "RAPL zone power over the last tick (powercap energy_uj).", labels=["zone"])
        energy = f.counter("aithermd_rapl_energy_joules", "RAPL zone energy counter (powercap).",
                           labels=["zone"])
        limits = f.gauge("aithermd_rapl_power_limit_watts", "RAPL power cap (PL1 long_term, PL2 "
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

    def _policy(self, s: Snapshot, f: Any) -> Iterator[Any]:
        active = f.gauge("aithermd_policy_active", "1 for the active policy.", labels=["policy"])
        if s.policy.active:
            active.add_metric([s.policy.active], 1.0)
        holds = f.gauge("aithermd_policy_holds", "Holds on top of the active policy.",
                        labels=["policy"])
        per_policy: dict[str, int] = {}
        for h in s.policy.holds:
            per_policy[h.policy] = per_policy.get(h.policy, 0) + 1
        for policy, n in sorted(per_policy.items()):
            holds.add_metric([policy], float(n))
        failsafe = f.gauge("aithermd_failsafe_active", "1 while the safety layer drives this knob.",
                           labels=["knob"])
        for knob_id, d in s.decisions.items():
            failsafe.add_metric([knob_id], 1.0 if d.layer is Layer.SAFETY else 0.0)
        degraded = f.gauge("aithermd_degraded", "1 for each device, channel or knob in trouble.",
                           labels=["id"])
        for item in s.degraded:
            degraded.add_metric([item], 1.0)
        yield from (active, holds, failsafe, degraded)

    def _events(self, s: Snapshot, f: Any) -> Iterator[Any]:
        c = self._counters
        decisions = f.counter("aithermd_decisions", "Changes of a knob's winning decision.",
                              labels=["knob", "rule"])
        for (knob, rule), n in c.decisions.items():
            decisions.add_metric([knob, rule], float(n))
        drift = f.counter("aithermd_drift", "Drift and conflict events per knob.", labels=["knob"])
        for knob, n in c.drift.items():
            drift.add_metric([knob], float(n))
        faults = f.counter("aithermd_faults", "Fault events per device.", labels=["device"])
        for device, n in c.faults.items():
            faults.add_metric([device], float(n))
        yield from (decisions, drift, faults)


class MetricsHandle:
    """A running exporter (or none): ``registry``, ``collector``, ``address`` (host, port) or None,
    ``observe_tick(seconds)``, ``stop()``."""

    def __init__(self, hub: StateHub) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.exposition = out = Exposition(self.registry)  # a collector's text kept while its inputs hold
        self.ahead = Ahead()  # the scrapes' rhythm: render after the tick before the next one
        self.counters = c = EventCounters()
        self.collector = SnapshotCollector(hub, c)  # the whole, as one collector; registered in parts:
        for part in SnapshotCollector.PARTS:
            one = SnapshotCollector(hub, c, part)
            out.add(one, one.inputs)
        out.add(BudgetCollector(hub), lambda: (getattr(hub.latest, "budget", None),))
        # process_* (CPU seconds, resident memory, fds, start time) and python_info, as every client has them;
        # process_* read once a tick (at the first render after it), so a render made ahead holds them too
        out.add(ProcessFigures(), lambda: (hub.latest, self._tick.state))
        out.add(PlatformCollector(registry=None), tuple)  # the interpreter's version: never changes
        self.above_limit = above = AboveLimitCounter()  # GPU health, NVML, RAPL availability, udev, D-Bus
        health = HealthCollector(hub, above)
        out.add(health, health.inputs)
        self._tick = out.add(TickHistogram("aithermd_tick_duration_seconds", "Duration of one control-loop "
                                           "tick.", TICK_BUCKETS_S), lambda: (self._tick.state,))
        from aithermd.publish.fan_metrics import FanCollector, StallCounter

        stalls = StallCounter()
        fans = FanCollector(hub, stalls)
        out.add(fans, fans.inputs)
        self._remove_listeners = (hub.add_listener(self.counters.on_publish),
                                  hub.add_listener(self.above_limit.on_publish),
                                  hub.add_listener(stalls.on_publish))
        self._server: ScrapeServer | None = None
        self.address: tuple[str, int] | None = None

    def observe_tick(self, seconds: float) -> None:
        """Record one tick's duration (s) in ``aithermd_tick_duration_seconds``; then, when a scrape is due
        before the next tick (:class:`~aithermd.publish.scrape.Ahead`), render what changed at this tick
        now, so that the scrape finds it kept (called on the loop's thread after each tick)."""
        self._tick.observe(seconds)  # a new state tuple: the histogram's text is kept until then
        if self.ahead.due():
            self.ahead.render(self.exposition)

    def serve(self, host: str, port: int, sock: Any = None) -> None:
        """Serve ``/metrics`` (:class:`~aithermd.publish.scrape.ScrapeServer`: one thread, asleep until a
        scraper connects, one request at a time, a client gets ``CLIENT_TIMEOUT_S`` to send its request),
        always in the classic text format (0.0.4: Prometheus accepts it, and it renders in two thirds of the
        time of OpenMetrics)."""
        body = lambda: self.ahead.scrape(self.exposition)  # noqa: E731 - its time noted, for Ahead
        self._server = ScrapeServer(host, port, body, sock)  # sock: its port, taken already
        self.address = self._server.address

    def stop(self) -> None:
        """Stop serving and detach from the hub; safe to call twice."""
        for remove in self._remove_listeners:
            remove()
        if self._server is not None:
            self._server.stop()
            self._server = None


def start(listen: str, hub: StateHub, energy: Any = None, sock: Any = None) -> MetricsHandle:
    """Serve ``/metrics`` on ``listen`` (``"HOST:PORT"``, port 0 picks a free one; ``"none"`` serves nothing
    but still counts, so ``observe_tick`` always works). ``energy``: the daemon's energy service, whose
    accounting families (:mod:`aithermd.publish.energy_metrics`) are added. Raises ValueError for a
    malformed address and OSError when the port cannot be had (the daemon turns both into a warning).
    ``sock``: the socket listening on ``listen`` already (:func:`aithermd.publish.listen.bind`), served."""
    handle = MetricsHandle(hub)
    if energy is not None:
        from aithermd.publish.energy_metrics import EnergyCollector

        export = lambda: energy.exporter.export  # noqa: E731 - replaced, never mutated, at each pass
        handle.exposition.add(EnergyCollector(export), lambda: (export(),))
    address = parse_listen(listen)
    if address is not None:
        try:
            handle.serve(*address, sock)
        except BaseException:
            handle.stop()
            raise
    return handle


def render(handle: MetricsHandle) -> bytes:
    """The text exposition of the handle's registry (what a scrape returns; the bytes
    ``prometheus_client.generate_latest`` would give), each collector's text kept while its inputs hold.
    Safe from any thread (one render at a time)."""
    return handle.ahead.render(handle.exposition, wait=True)


__all__: Sequence[Any] = ("CLIENT_TIMEOUT_S", "DEFAULT_METRICS_LISTEN", "MetricsHandle", "SnapshotCollector", "EventCounters",
                          "parse_listen", "render", "start", "node_exporter_chip")
