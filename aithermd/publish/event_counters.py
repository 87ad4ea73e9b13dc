"""Counters the exporter keeps from the hub's events (decisions, drift, faults): :class:`EventCounters`."""

from __future__ import annotations

from collections.abc import Sequence

from aithermd.model import Event, Snapshot
from aithermd.publish.document import decision_changes


class EventCounters:
    """Decision, drift and fault counters, fed by a hub listener (event-loop thread).

    ``decisions``: {(knob, rule): n} counts changes of a knob's winning decision (rule or value);
    ``drift``: {knob: n} counts ``drift``/``conflict`` events; ``faults``: {device: n} counts ``fault``
    events.
    ``drift`` and ``faults`` hold every knob and device of the snapshot from the first one it appears in
    (start or hotplug), at 0 until its first event, so ``increase()`` and ``rate()`` see that first event
    (a series born at 1 increases by nothing). A knob or device that leaves the snapshot (a GPU lost, a
    module unloaded) leaves the exposition, and its counts are kept aside: when it comes back its series
    go on from where they were, never from 0 (attack4: ``decisions_total`` 21 → 1 after a GPU came back,
    which ``rate()`` reads as a reset). Each dict is replaced, never mutated, once published, so the
    scrape thread reads a consistent copy without a lock.
    """

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], int] = {}
        self.drift: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self._previous: Snapshot | None = None
        self._away: tuple[dict[tuple[str, str], int], dict[str, int], dict[str, int]] = ({}, {}, {})

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        decisions_away, drift_away, faults_away = self._away
        changed = decision_changes(self._previous, snapshot)
        if changed:
            decisions = dict(self.decisions)
            for d in changed:
                key = (d.knob_id, d.rule)
                decisions[key] = decisions.get(key, decisions_away.get(key, 0)) + 1
            self.decisions = decisions
        drift, faults = None, None
        for e in events:  # a subject away (a fault of the GPU just lost) counts on from its count
            if e.kind in ("drift", "conflict"):
                drift = dict(self.drift) if drift is None else drift
                drift[e.subject] = drift.get(e.subject, drift_away.get(e.subject, 0)) + 1
            elif e.kind == "fault":
                device = str(e.data.get("device") or e.subject.split("/", 1)[0])
                faults = dict(self.faults) if faults is None else faults
                faults[device] = faults.get(device, faults_away.get(device, 0)) + 1
        if drift is not None:
            self.drift = drift
        if faults is not None:
            self.faults = faults
        if self._previous is None or self._previous.devices is not snapshot.devices:
            self._follow_devices(snapshot)
        self._previous = snapshot

    def _follow_devices(self, snapshot: Snapshot) -> None:
        """Counters for exactly the snapshot's devices and knobs: new ones at 0 (or at their counts from
        before they left), vanished ones set aside."""
        devices = [d.id for d in snapshot.devices]
        knobs = [k.id for d in snapshot.devices for k in d.knobs]
        present = set(knobs)
        decisions_away, drift_away, faults_away = self._away
        every = {**decisions_away, **self.decisions}
        self.decisions = {k: v for k, v in every.items() if k[0] in present}
        decisions_away = {k: v for k, v in every.items() if k[0] not in present}
        drift_away = {**drift_away, **self.drift}
        faults_away = {**faults_away, **self.faults}
        self.drift = {k: drift_away.pop(k, 0) for k in knobs}
        self.faults = {d: faults_away.pop(d, 0) for d in devices}
        self._away = (decisions_away, drift_away, faults_away)
