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
