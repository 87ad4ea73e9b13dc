"""A bounded, time-aligned history of the series the TUI plots: seeded from ``GetHistory``, extended by
each snapshot. Pure data, no I/O.

``GetHistory`` shape: :class:`aithermd.publish.wire.HistoryDoc` (``{"t": [wall s, ...], "series":
{channel_or_knob_id: [value | None, ...]}, "units": {id: unit}}``).
"""

from __future__ import annotations

from collections import deque

from aithermctl.document import value
from aithermd.publish.wire import HistoryDoc, SnapshotDoc

# what a plot shows, per device kind: channel attributes and knob names
PLOTTED = {"gpu": ("temperature", "power", "utilization", "power_limit", "memory_utilization", "fan0"),
           "powercap": ("power", "pl1", "pl2")}


def plotted_ids(doc: SnapshotDoc) -> dict[str, float | None]:
    """The plotted channel and knob ids of ``doc`` with their present values."""
    out: dict[str, float | None] = {}
    for device in doc.get("devices") or ():
        wanted = PLOTTED.get(str(device.get("kind")))
        if not wanted:
            continue
        for entry in (*(device.get("channels") or ()), *(device.get("knobs") or ())):
            if entry["id"].rsplit("/", 1)[-1] in wanted:
                out[entry["id"]] = value(entry)
    return out


class History:
    """Samples of the last ``horizon_s`` seconds (wall clock), all series aligned on one time axis."""

    def __init__(self, horizon_s: float = 600.0) -> None:
        self.horizon_s = horizon_s
        self.t: deque[float] = deque()
        self.series: dict[str, deque[float | None]] = {}

    def load(self, history: HistoryDoc) -> None:
        """Replace everything with a ``GetHistory`` document; series of unequal length are right-aligned."""
        times = [float(t) for t in history.get("t") or ()]
        self.t = deque(times)
        self.series = {}
        for key, values in (history.get("series") or {}).items():
            vals = [float(v) if isinstance(v, int | float) else None for v in values][-len(times):]
            self.series[key] = deque([None] * (len(times) - len(vals)) + vals)
        self._trim()

    def append(self, t_wall: float, doc: SnapshotDoc) -> None:
        """Add one snapshot taken at ``t_wall``; ignored unless later than the last sample."""
        if self.t and t_wall <= self.t[-1]:
            return
        current = plotted_ids(doc)
        self.t.append(t_wall)
        for key, series in self.series.items():
            series.append(current.pop(key, None))
        for key, v in current.items():  # a series seen for the first time
            self.series[key] = deque([None] * (len(self.t) - 1) + [v])
        self._trim()

    def _trim(self) -> None:
        if not self.t:
            return
        horizon = self.t[-1] - self.horizon_s
        while self.t and self.t[0] < horizon:
            self.t.popleft()
            for series in self.series.values():
                series.popleft()

    def window(self, key: str, span_s: float) -> list[tuple[float, float | None]]:
        """``(t, value)`` of ``key`` over the last ``span_s`` seconds (empty when unknown)."""
        series = self.series.get(key)
        if series is None or not self.t:
            return []
        start = self.t[-1] - span_s
        return [(t, v) for t, v in zip(self.t, series, strict=True) if t >= start]
