"""``GetHistory(seconds)``: the last seconds of published snapshots as columns.

Shape: ``{"t": [wall-clock s, ...], "series": {channel or knob id: [value or null, ...]},
"units": {id: unit}}``, oldest first, one entry per snapshot of the hub's ring buffer
(:meth:`~aithermd.publish.hub.StateHub.snapshots`). Channel values are readings in the channel's unit (null
when not ok); knob values are the read-back settings in daemon units. A series that appears or vanishes
mid-window is padded with null. The JSON text is cached per (latest snapshot, seconds), so many clients
asking in one tick cost one serialisation; a long window is built off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from aithermd.errors import InvalidArgument
from aithermd.model import Snapshot, Status
from aithermd.publish.hub import StateHub


def history_document(snapshots: list[Snapshot]) -> dict[str, Any]:
    """Columns of ``snapshots`` (oldest first); see the module docstring."""
    n = len(snapshots)
    series: dict[str, list[float | None]] = {}
    units: dict[str, str] = {}
    for i, s in enumerate(snapshots):
        for dev in s.devices:
            for ch in dev.channels:
                units.setdefault(ch.id, ch.unit)
            for k in dev.knobs:
                units.setdefault(k.id, k.unit)
        for cid, r in s.readings.items():
            column = series.get(cid)
            if column is None:
                column = series[cid] = [None] * n
            v = r.value
            column[i] = v if r.status is Status.OK and v is not None and math.isfinite(v) else None
        for kid, kv in s.knobs.items():
            column = series.get(kid)
            if column is None:
                column = series[kid] = [None] * n
            v = kv.value
            column[i] = v if v is not None and math.isfinite(v) else None
    return {"t": [s.t_wall for s in snapshots], "series": series, "units": units}


class History:
    """``GetHistory`` over a hub: small windows are built on the event loop, long ones (≥
    ``thread_above`` snapshots, tens of ms for the full ring) in a worker thread so the loop keeps ticking;
    concurrent asks for the same window share one build, and the last answer is cached."""

    def __init__(self, hub: StateHub, *, thread_above: int = 120) -> None:
        self._hub = hub
        self._thread_above = thread_above
        self._key: tuple[int, float] | None = None
        self._text: asyncio.Future[str] | None = None

    async def text(self, seconds: float) -> str:
        """JSON of the last ``seconds`` (capped at the hub's ``history_s``). Raises InvalidArgument for a
        negative, NaN or infinite ``seconds``."""
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument(f"seconds must be a finite number ≥ 0, got {seconds!r}")
        seconds = min(seconds, self._hub.history_s)
        latest = self._hub.latest
        key = (latest.seq if latest is not None else -1, seconds)
        if key != self._key or self._text is None:
            snapshots = self._hub.snapshots(seconds)
            self._key = key
            if len(snapshots) < self._thread_above:
                self._text = asyncio.get_running_loop().create_future()
                self._text.set_result(_dumps(snapshots))
            else:
                self._text = asyncio.ensure_future(asyncio.to_thread(_dumps, snapshots))
        return await asyncio.shield(self._text)


def _dumps(snapshots: list[Snapshot]) -> str:
    return json.dumps(history_document(snapshots), separators=(",", ":"))
