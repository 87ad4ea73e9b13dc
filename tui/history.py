"""A bounded, time-aligned history of the series the TUI plots: seeded from ``GetHistory``, extended by
each snapshot. Pure data, no I/O.

``GetHistory`` shape: :class:`aithermd.publish.wire.HistoryDoc` (``{"t": [wall s, ...], "series": {channel
id: [value | None, ...]}, "units": {id: unit}, "knobs": {knob id: [...]}, "knob_units": {...}}``). Channels
and knobs stay apart here too: NVML's ``gpu0/fan0`` is both the fan's speed (a channel) and the duty asked
of it (a knob).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from aithermctl.document import value
from aithermd.publish.wire import HistoryDoc, SnapshotDoc

# what a plot shows, per device kind: channel attributes, and knob names
PLOTTED = {"gpu": ("temperature", "power", "utilization", "memory_utilization", "fan0"),
           "powercap": ("power",)}
PLOTTED_KNOBS = {"gpu": ("power_limit", "fan0"), "powercap": ("pl1", "pl2")}


def plotted_ids(doc: SnapshotDoc) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """The plotted channel ids and knob ids of ``doc``, each with its present value."""
    chans: dict[str, float | None] = {}
    knobs: dict[str, float | None] = {}
    for device in doc.get("devices") or ():
        kind = str(device.get("kind"))
        for out, entries, wanted in ((chans, device.get("channels") or (), PLOTTED.get(kind, ())),
                                     (knobs, device.get("knobs") or (), PLOTTED_KNOBS.get(kind, ()))):
            for entry in entries:
                if entry["id"].rsplit("/", 1)[-1] in wanted:
                    out[entry["id"]] = value(entry)
    return chans, knobs


class History:
    """Samples of the last ``horizon_s`` seconds (wall clock), all series aligned on one time axis: channel
    readings in :attr:`series`, knob values in :attr:`knobs`."""

    def __init__(self, horizon_s: float = 600.0) -> None:
        self.horizon_s = horizon_s
        self.t: deque[float] = deque()
        self.series: dict[str, deque[float | None]] = {}
        self.knobs: dict[str, deque[float | None]] = {}

    def load(self, history: HistoryDoc) -> None:
        """Replace everything with a ``GetHistory`` document; series of unequal length are right-aligned."""
        times = [float(t) for t in history.get("t") or ()]
        self.t = deque(times)
        self.series = _columns(history.get("series") or {}, len(times))
        self.knobs = _columns(history.get("knobs") or {}, len(times))
        self._trim()

    def append(self, t_wall: float, doc: SnapshotDoc) -> None:
        """Add one snapshot taken at ``t_wall``; ignored unless later than the last sample."""
        if self.t and t_wall <= self.t[-1]:
            return
        self.t.append(t_wall)
        for store, current in zip((self.series, self.knobs), plotted_ids(doc), strict=True):
            for key, series in store.items():
                series.append(current.pop(key, None))
            for key, v in current.items():  # a series seen for the first time
                store[key] = deque([None] * (len(self.t) - 1) + [v])
        self._trim()

    def _trim(self) -> None:
        if not self.t:
            return
        horizon = self.t[-1] - self.horizon_s
        while self.t and self.t[0] < horizon:
            self.t.popleft()
            for series in (*self.series.values(), *self.knobs.values()):
                series.popleft()

    def window(self, key: str, span_s: float, *, knob: bool = False) -> list[tuple[float, float | None]]:
        """``(t, value)`` of channel ``key`` (of knob ``key`` with ``knob``) over the last ``span_s``
        seconds (empty when unknown)."""
        series = (self.knobs if knob else self.series).get(key)
        if series is None or not self.t:
            return []
        start = self.t[-1] - span_s
        return [(t, v) for t, v in zip(self.t, series, strict=True) if t >= start]


def _columns(columns: Mapping[str, list[float | None]], rows: int) -> dict[str, deque[float | None]]:
    out = {}
    for key, values in columns.items():
        vals = [float(v) if isinstance(v, int | float) else None for v in values][-rows:] if rows else []
        out[key] = deque([None] * (rows - len(vals)) + vals)
    return out
