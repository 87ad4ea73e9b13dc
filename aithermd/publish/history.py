"""``GetHistory(seconds)``: the last seconds of published values as columns.

Shape (:class:`~aithermd.publish.wire.HistoryDoc`): ``{"t": [wall-clock s, ...], "series": {channel id:
[value or null, ...]}, "units": {channel id: unit}, "knobs": {knob id: [value or null, ...]}, "knob_units":
{knob id: unit}}``, oldest first, one entry per published tick kept by the hub's
:class:`~aithermd.publish.columns.Columns`. Channel values are readings in the channel's unit (null when
not ok); knob values are the read-back settings in daemon units, kept apart from the channels (a knob and a
channel may share an id: NVML's ``gpu0/fan0``). A series that appears or vanishes
mid-window is padded with null. The JSON text is cached per (latest snapshot, seconds), so many clients
asking in one tick cost one serialisation; the window is copied out on the event loop (array slices) and a
long one is turned into JSON in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import math

from aithermd.errors import InvalidArgument
from aithermd.publish.columns import Window
from aithermd.publish.hub import StateHub


class History:
    """``GetHistory`` over a hub: small windows are serialised on the event loop, long ones (≥
    ``thread_above`` rows) in a worker thread so the loop keeps ticking; concurrent asks for the same
    window share one build, and the last answer is cached."""

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
            window = self._hub.columns.copy(seconds)
            self._key = key
            if len(window) < self._thread_above:
                self._text = asyncio.get_running_loop().create_future()
                self._text.set_result(_dumps(window))
            else:
                self._text = asyncio.ensure_future(asyncio.to_thread(_dumps, window))
        return await asyncio.shield(self._text)


def _dumps(window: Window) -> str:
    return json.dumps(window.document(), separators=(",", ":"))
