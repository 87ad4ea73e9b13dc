"""Devices whose chip does not answer: the apply path neither writes their knobs nor reads them back.

A device the read guard holds as hung (:class:`~aithermd.backends.guard.Quarantine`: a read of it did not
answer within the guard's deadline; or its whole backend held) is, for actuation, a lost device: writing a
knob of an inline backend reads it (the original for the journal, the read-back after the write) and writes
it on the event loop, and one lock in the driver usually blocks the chip's reads and writes alike (attack10
W1r, W2). So :meth:`~aithermd.actuate.execute.Executor.apply` drops every decision and hand-back of such a
device — whoever asks: the tick, the fast lane, a resume — while the safety layer drives its fans to full
where it can be reached (the chip's own fans cannot). Each of its knobs the daemon owns or decides carries
an ``uncontrollable`` alarm ("its chip does not answer"), and a ``fault`` event says when control stops, a
``recovered`` one when it resumes. Nothing is forgotten meanwhile: the journal keeps the originals, so a
knob written again once its chip answers keeps its first original, and the final restore still puts it back
(each device under its own deadline, :mod:`aithermd.actuate.restore_devices`: one lock in the driver may hold
its writes as well as its reads). A device whose *write* hung (:mod:`aithermd.actuate.inline`) is held the
same way until that write returns, and is not written by the stop at all (left journaled).

:class:`Unanswered` holds that set (device id → why, since when); the tick sets it after each sample from
the read guard (:meth:`aithermd.runtime.sampling.Sampler.hung`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import structlog

from aithermd.model import Alarm, Decision, Event, Knob

ALARM = "its chip does not answer ({why}): not written until it does"

_log = structlog.get_logger("aithermd.hung")


class Unanswered:
    """Devices not to be touched by the apply path: ``devices`` device id → why; ``since`` device id → wall s
    when it was first held (see the module doc)."""

    def __init__(self) -> None:
        self.devices: dict[str, str] = {}
        self.since: dict[str, float] = {}
        self.writes: dict[str, str] = {}  # device id → why, while a write given up on has not returned

    def update(self, reads: Mapping[str, str], t_wall: float) -> list[Event]:
        """Take ``reads`` (device id → why: the devices the read guard holds as hung now) as the set; returns
        a ``fault`` event per device newly held, a ``recovered`` one per device released."""
        if not reads and not self.devices:
            return []
        events: list[Event] = []
        reads = {**reads, **self.writes} if self.writes else reads
        for device, why in reads.items():
            if device not in self.devices:
                self.since[device] = t_wall
                message = f"{device}: " + ALARM.format(why=why)
                _log.error("fault", subject=device, message=message, why="unanswered", detail=why)
                events.append(Event("fault", t_wall, device, message, {"why": "unanswered", "detail": why}))
        for device in [d for d in self.devices if d not in reads]:
            del self.since[device]
            message = f"{device} answers again: its knobs are written again"
            _log.info("recovered", subject=device, message=message, why="unanswered")
            events.append(Event("recovered", t_wall, device, message, {"why": "unanswered"}))
        self.devices = dict(reads)
        return events

    def write_hung(self, device: str, knob_id: str, deadline_s: float, t_wall: float) -> Event:
        """A write to ``knob_id`` of ``device`` did not return within ``deadline_s``: held until it does
        (:meth:`returned`). Returns the ``fault`` event (``why`` ``write_hung``)."""
        why = self.writes[device] = f"write hung: no answer within {deadline_s:g} s"
        self.devices = {**self.devices, device: why}
        self.since.setdefault(device, t_wall)
        message = f"{knob_id}: the write did not return; {device}: " + ALARM.format(why=why)
        _log.error("fault", subject=knob_id, message=message, why="write_hung", device=device)
        return Event("fault", t_wall, knob_id, message, {"why": "write_hung", "device": device})

    def returned(self, device: str) -> None:
        """The write given up on returned: ``device`` is released at the next :meth:`update`."""
        self.writes.pop(device, None)

    @staticmethod
    def split(entries: Mapping[str, Any], mute: Collection[str]) -> dict[str, str]:
        """Of the journal's ``entries`` (knob id → entry with ``device_id``), those of the devices in ``mute``
        (a write to them hung and has not returned): knob id → why; not restored at the stop."""
        return {k: f"its chip does not answer ({e.device_id}: a write hung): left journaled for "
                "'aithermd restore'" for k, e in entries.items() if e.device_id in mute}

    def drop(self, knobs: Mapping[str, Knob], decisions: Iterable[tuple[str, Decision]],
             back: Collection[str]) -> tuple[list[tuple[str, Decision]], list[str]]:
        """``decisions`` and ``back`` (knob ids) without the knobs of the devices held."""
        held = self.devices

        def ok(knob_id: str) -> bool:
            knob = knobs.get(knob_id)
            return knob is None or knob.device_id not in held

        return [item for item in decisions if ok(item[0])], [k for k in back if ok(k)]

    def alarms(self, knobs: Mapping[str, Knob], wanted: Iterable[str]) -> dict[str, Alarm]:
        """An ``uncontrollable`` alarm for each knob of ``wanted`` (ids: owned or decided) on a device
        held."""
        out: dict[str, Alarm] = {}
        for knob_id in wanted:
            knob = knobs.get(knob_id)
            if knob is not None and (why := self.devices.get(knob.device_id)) is not None:
                out[knob_id] = Alarm("uncontrollable", f"{knob_id}: " + ALARM.format(why=why),
                                     self.since.get(knob.device_id, 0.0))
        return out
