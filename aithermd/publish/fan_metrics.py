"""Fan and knob alarms for Prometheus: stalled fans, stalls counted, knobs in a conflict, knobs whose driver
refuses what the daemon must write.

Every series exists from the moment its fan or knob is known, at 0, so an alert fires on the first stall:

- ``aithermd_fan_stalled{chip, node_chip, sensor, label}``: 1 while the fan input is stalled (the stall
  detector's alarm), per hwmon fan input, with the labels of ``aithermd_fan_speed_rpm`` (they join);
- ``aithermd_fan_stalls_total``: stalls called, per fan input, counted from the hub's ``alarm`` events;
- ``aithermd_fan_tach_blind{chip, node_chip, sensor, label}``: 1 while the fan input's speed is known not to
  be readable at low duty (the stall detector's ``blind`` alarm: not judged there, so a person should
  calibrate it), per hwmon fan input;
- ``aithermd_knob_conflict{knob}``: 1 while another program keeps rewriting the knob (policy decisions step
  back; safety ones are still written), per writable knob;
- ``aithermd_knob_uncontrollable{knob}``: 1 while the knob's driver refuses what it is asked every time (a
  fan that takes neither its mode nor its duty; a GPU power limit the driver will not cut below the limit in
  force, attack4 B10), or while its chip does not answer (a read of it hangs: not written until it does,
  :mod:`aithermd.actuate.hung`), per knob;
- ``aithermd_knob_refused{knob}``: 1 while a *safety* decision is refused permission on a knob the daemon has
  written (NVML ``NO_PERMISSION``: the knob stays at the daemon's value, e.g. a limit it raised, over a trip
  point; :mod:`aithermd.actuate.refusals`), per knob. The decision is tried again every tick; this series is
  what pages a person (attack5 C5).

Alerts on them ship in ``packaging/fleet/prometheus/aithermd-alerts.yml``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from aithermd.actuate.refusals import REFUSED
from aithermd.model import DeviceKind, Event, Quantity, Snapshot
from aithermd.publish.hub import StateHub
from aithermd.publish.series_labels import node_exporter_chip
from aithermd.publish.textfam import PROM, TextCollector

_FAN_LABELS = ["chip", "node_chip", "sensor", "label"]


class StallCounter:
    """Stalls per fan input, from the hub's ``alarm`` events (event-loop thread; the dict is replaced,
    never mutated, once published). Every fan input of the snapshot is there at 0."""

    def __init__(self) -> None:
        self.stalls: dict[str, int] = {}
        self._devices: object = None

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        stalls = None
        for e in events:
            if e.kind == "alarm" and e.data.get("alarm") == "stalled":
                stalls = dict(self.stalls) if stalls is None else stalls
                stalls[e.subject] = stalls.get(e.subject, 0) + 1
        if stalls is not None:
            self.stalls = stalls
        if snapshot.devices is not self._devices:
            self._devices = snapshot.devices
            fans = [c.id for d in snapshot.devices if d.kind is DeviceKind.HWMON for c in d.channels
                    if c.quantity is Quantity.FAN]
            self.stalls = {f: self.stalls.get(f, 0) for f in fans}


class FanCollector(TextCollector):
    """Renders the alarms of ``hub.latest`` and the :class:`StallCounter` (see the module doc)."""

    def __init__(self, hub: StateHub, counter: StallCounter) -> None:
        self._hub, self._counter = hub, counter

    def inputs(self) -> tuple[Any, ...]:
        """What the text is made of, compared by value: the devices, the alarms, the stall counts."""
        s = self._hub.latest
        return (None,) if s is None else (s.devices, s.alarms, self._counter.stalls)

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        s = self._hub.latest
        if s is None:
            return
        stalled = f.gauge("aithermd_fan_stalled", "1 while the fan input is stalled (no speed "
                          "under duty after a kick-start).", labels=_FAN_LABELS)
        stalls = f.counter("aithermd_fan_stalls", "Stalls called per fan input.",
                           labels=_FAN_LABELS)
        blind = f.gauge("aithermd_fan_tach_blind", "1 while the fan input's speed cannot be read at low "
                        "duty (not judged there; calibrate it).", labels=_FAN_LABELS)
        conflict = f.gauge("aithermd_knob_conflict", "1 while another program keeps rewriting the "
                           "knob (policy decisions step back; safety ones are still written).",
                           labels=["knob"])
        uncontrollable = f.gauge("aithermd_knob_uncontrollable", "1 while the knob's driver refuses what "
                                 "it is asked every time (a fan's mode and duty; a power limit cut).",
                                 labels=["knob"])
        refused = f.gauge("aithermd_knob_refused", "1 while a safety decision is refused permission on a "
                          "knob the daemon has written (tried again every tick).", labels=["knob"])
        alarms = s.alarms
        counts = self._counter.stalls
        for dev in s.devices:
            if dev.kind is DeviceKind.HWMON:
                chip, node_chip = dev.id.removeprefix("hwmon:"), node_exporter_chip(dev)
                for ch in dev.channels:
                    if ch.quantity is not Quantity.FAN:
                        continue
                    labels = [chip, node_chip, ch.attribute, ch.label or ch.attribute]
                    alarm = alarms.get(ch.id)
                    kind = alarm.kind if alarm is not None else ""
                    stalled.add_metric(labels, 1.0 if kind == "stalled" else 0.0)
                    stalls.add_metric(labels, float(counts.get(ch.id, 0)))
                    blind.add_metric(labels, 1.0 if kind == "blind" else 0.0)
            for knob in dev.knobs:
                alarm = alarms.get(knob.id)
                kind = alarm.kind if alarm is not None else ""
                if knob.writable:
                    conflict.add_metric([knob.id], 1.0 if kind == "conflict" else 0.0)
                uncontrollable.add_metric([knob.id], 1.0 if kind == "uncontrollable" else 0.0)
                refused.add_metric([knob.id], 1.0 if kind == REFUSED else 0.0)
        yield from (stalled, stalls, blind, conflict, uncontrollable, refused)
