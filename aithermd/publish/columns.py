"""The history behind ``GetHistory``: one preallocated column of float64 per series, not a ring of snapshots.

A :class:`Columns` keeps the last ``history_s`` of published values (channel readings in the channel's unit,
NaN when not ok; knob values read back, in daemon units; the two apart, as a channel and a knob may share an
id: NVML's ``gpu0/fan0``) in ``array('d')`` columns of ``rows`` slots written round-robin, plus the
monotonic and wall time of each row. Rows = ``history_s / tick_s + 1``
(1 Hz, 900 s: 901), fewer when the columns would pass :data:`BUDGET_BYTES` (then the history is shorter:
memory is bounded in bytes whatever the sensor count; 500 series at 1 Hz take 3.6 MB). Columns are
allocated whole when a series first appears, so memory does not grow as the history fills, and a series
that has been absent for a whole lap is dropped when the device set changes. Each append writes one float
per series.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from aithermd.model import Snapshot, Status

NAN = math.nan
BUDGET_BYTES = 4 * 1024 * 1024  # value columns; 500 series × 901 rows × 8 B = 3.6 MB


class Columns:
    """The column store (see the module doc). ``append(snapshot)`` once per publish; :meth:`document` gives
    ``{"t": [...], "series": {channel id: [...]}, "units": {...}, "knobs": {knob id: [...]},
    "knob_units": {...}}``. Channels and knobs are kept apart: an NVML fan's reading and its knob share
    the id ``gpu0/fan0``."""

    def __init__(self, history_s: float = 900.0, max_rows: int = 3600,
                 budget_bytes: int = BUDGET_BYTES) -> None:
        self.history_s, self.max_rows, self.budget_bytes = history_s, max_rows, budget_bytes
        self.rows = 0  # slots per column (0 until the first append tells the tick)
        self.count = 0  # rows ever appended
        self._t_mono = array("d")
        self._t_wall = array("d")
        self._cols: dict[str, array[float]] = {}  # channel id → readings
        self._kcols: dict[str, array[float]] = {}  # knob id → read-back values
        # channel → the row count when it was last present, kept only from rows where some series was absent:
        # a row where every series is present sets ``_full`` instead of one entry per series (see _present)
        self._last: dict[str, int] = {}
        self._klast: dict[str, int] = {}  # knob → the same
        self._full = self._kfull = -1  # the last row count at which every channel (knob) column was written
        self.units: dict[str, str] = {}
        self.knob_units: dict[str, str] = {}
        self._devices: Any = None

    @property
    def nbytes(self) -> int:
        return 8 * self.rows * (len(self._cols) + len(self._kcols) + 2)

    def _fit(self, series: int) -> int:
        want = self.rows or min(self.max_rows, int(self.history_s / self._tick_s) + 1)
        return max(2, min(want, self.budget_bytes // (8 * max(1, series))))

    def _resize(self, rows: int) -> None:
        """Reallocate every column to ``rows`` slots, keeping the newest rows in place order."""
        keep = min(rows, self.count, self.rows)
        old = self.rows

        def moved(col: array[float]) -> array[float]:
            new = array("d", [NAN]) * rows
            for k in range(keep):
                n = self.count - keep + k
                new[n % rows] = col[n % old]
            return new

        self._t_mono, self._t_wall = moved(self._t_mono), moved(self._t_wall)
        self._cols = {k: moved(c) for k, c in self._cols.items()}
        self._kcols = {k: moved(c) for k, c in self._kcols.items()}
        self.rows = rows

    def _add_columns(self, snapshot: Snapshot) -> None:
        """Columns for every series of ``snapshot`` not yet kept (shrinking the rows to the budget)."""
        new = [s for s in snapshot.readings if s not in self._cols]
        knobs = [s for s in snapshot.knobs if s not in self._kcols]
        rows = self._fit(len(self._cols) + len(self._kcols) + len(new) + len(knobs))
        if rows < self.rows:
            self._resize(rows)
        for sid in new:
            self._cols[sid] = array("d", [NAN]) * self.rows
        for sid in knobs:
            self._kcols[sid] = array("d", [NAN]) * self.rows

    def _devices_changed(self, snapshot: Snapshot) -> None:
        self._devices = snapshot.devices
        for dev in snapshot.devices:
            for ch in dev.channels:
                self.units.setdefault(ch.id, ch.unit)
            for k in dev.knobs:
                self.knob_units.setdefault(k.id, k.unit)
        for cols, last, full, units in ((self._cols, self._last, self._full, self.units),
                                        (self._kcols, self._klast, self._kfull, self.knob_units)):
            for sid in [s for s in cols if self.count - _present(s, last, full) >= self.rows]:
                cols.pop(sid, None)
                last.pop(sid, None)
                units.pop(sid, None)

    def append(self, snapshot: Snapshot) -> None:
        if not self.rows:
            self._tick_s = snapshot.tick_s if snapshot.tick_s > 0 else 1.0
            self.rows = self._fit(len(snapshot.readings) + len(snapshot.knobs))
            self._t_mono = array("d", [NAN]) * self.rows
            self._t_wall = array("d", [NAN]) * self.rows
        if snapshot.devices is not self._devices:
            self._devices_changed(snapshot)
        count = self.count
        i = count % self.rows
        cols, last, ok = self._cols, self._last, Status.OK
        written = 0
        for sid, r in snapshot.readings.items():
            col = cols.get(sid)
            if col is None:  # a new series: make every missing column (rows may shrink), then start over
                self._add_columns(snapshot)
                return self.append(snapshot)
            v = r.value
            col[i] = v if r.status is ok and v is not None else NAN
            written += 1
        kcols, klast = self._kcols, self._klast
        kwritten = 0
        for sid, kv in snapshot.knobs.items():
            col = kcols.get(sid)
            if col is None:
                self._add_columns(snapshot)
                return self.append(snapshot)
            v = kv.value
            col[i] = v if v is not None else NAN
            kwritten += 1
        # every series present (the common case): one mark for all; else the present ones each get theirs,
        # and a series absent from this snapshot has no value in this row
        if written == len(cols):
            self._full = count
        else:
            self._mark(snapshot.readings, cols, last, count, i)
        if kwritten == len(kcols):
            self._kfull = count
        else:
            self._mark(snapshot.knobs, kcols, klast, count, i)
        self._t_mono[i] = snapshot.t_mono
        self._t_wall[i] = snapshot.t_wall
        self.count = count + 1

    @staticmethod
    def _mark(present: Any, store: dict[str, array[float]], last: dict[str, int], count: int, i: int) -> None:
        for sid in present:
            last[sid] = count
        for sid, col in store.items():
            if last.get(sid) != count:
                col[i] = NAN

    def window(self, seconds: float) -> range:
        """Row numbers (oldest first) whose monotonic time is within ``seconds`` of the newest."""
        if not self.count:
            return range(0)
        first = max(0, self.count - self.rows)
        newest = self._t_mono[(self.count - 1) % self.rows]
        horizon = newest - seconds
        lo = first
        while lo < self.count and self._t_mono[lo % self.rows] < horizon:
            lo += 1
        return range(lo, self.count)

    def copy(self, seconds: float) -> Window:
        """The last ``seconds`` copied out (array slices, fast enough for the event loop); turn it into the
        document with :meth:`Window.document`, anywhere."""
        rows = self.window(seconds)
        start = rows.start if rows else self.count
        a, b = start % self.rows if self.rows else 0, len(rows)
        first = min(b, self.rows - a) if self.rows else 0  # slots a … a+first, then 0 … b-first

        def cut(col: array[float]) -> array[float]:
            return col[a:a + first] + col[:b - first] if b > first else col[a:a + first]

        series = {sid: cut(col) for sid, col in self._cols.items()
                  if _present(sid, self._last, self._full) >= start}
        knobs = {sid: cut(col) for sid, col in self._kcols.items()
                 if _present(sid, self._klast, self._kfull) >= start}
        return Window(cut(self._t_wall), series, {sid: self.units[sid] for sid in series if sid in self.units},
                      knobs, {sid: self.knob_units[sid] for sid in knobs if sid in self.knob_units})

    def document(self, seconds: float) -> dict[str, Any]:
        return self.copy(seconds).document()


def _present(sid: str, last: dict[str, int], full: int) -> int:
    """The row count at which series ``sid`` (a key of the columns) was last present: its own mark or the last
    row where every series was, whichever is later."""
    mark = last.get(sid, -1)
    return mark if mark > full else full


class Window:
    """Copied columns of one window: ``t`` (wall s), ``series`` (channel id → float64 array, NaN = none),
    ``units``, and the same for knobs (``knobs``, ``knob_units``)."""

    __slots__ = ("t", "series", "units", "knobs", "knob_units")

    def __init__(self, t: array[float], series: dict[str, array[float]], units: dict[str, str],
                 knobs: dict[str, array[float]] | None = None, knob_units: dict[str, str] | None = None) -> None:
        self.t, self.series, self.units = t, series, units
        self.knobs, self.knob_units = knobs or {}, knob_units or {}

    def __len__(self) -> int:
        return len(self.t)

    def document(self) -> dict[str, Any]:
        """``{"t": [...], "series": {channel id: [value or None, ...]}, "units": {id: unit}, "knobs": {knob id:
        [...]}, "knob_units": {id: unit}}`` (non-finite → None)."""
        isfinite = math.isfinite
        return {"t": self.t.tolist(),
                "series": {sid: [x if isfinite(x) else None for x in col] for sid, col in self.series.items()},
                "units": dict(self.units),
                "knobs": {sid: [x if isfinite(x) else None for x in col] for sid, col in self.knobs.items()},
                "knob_units": dict(self.knob_units)}
