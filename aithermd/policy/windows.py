"""Time-weighted windows over one metric: mean, min and max over the last ``window_s`` seconds.

Pure values: :meth:`Window.push` returns a new window. A sample's value covers the interval since the
previous sample (a "right step", as NVML utilization and averaged power are reported), so gaps in time are
weighted by their length. A window statistic is known only once the history reaches back ``window_s``.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

EPS_S = 1e-6


@dataclass(frozen=True, slots=True)
class Window:
    """Samples ``times`` (s, increasing), ``values`` and ``cum`` (∫ value dt from ``times[0]``)."""

    times: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    cum: tuple[float, ...] = ()

    def push(self, t: float, value: float, horizon_s: float) -> Window:
        """A new window with (t, value) appended, keeping what ``horizon_s`` needs (one sample at or before
        ``t − horizon_s`` stays as the boundary). A time not after the last sample replaces nothing."""
        times = self.times
        if times and t <= times[-1]:
            return self
        c = self.cum[-1] + value * (t - times[-1]) if times else 0.0
        times = (*times, t)
        values = (*self.values, value)
        cum = (*self.cum, c)
        k = bisect_right(times, t - horizon_s + EPS_S) - 1
        if k > 0:
            times, values, cum = times[k:], values[k:], cum[k:]
        return Window(times, values, cum)

    @property
    def last_t(self) -> float | None:
        return self.times[-1] if self.times else None

    def stat(self, stat: str, window_s: float, now: float) -> float | None:
        """``stat`` ("mean" | "min" | "max" | "last") over (now − window_s, now]; None when the history does
        not reach back that far or holds no sample inside the window."""
        times = self.times
        if not times:
            return None
        if stat == "last" or window_s <= 0:
            return self.values[-1]
        start = now - window_s
        if times[0] > start + EPS_S:
            return None
        i0 = bisect_right(times, start + EPS_S)
        if i0 >= len(times):
            return None
        if stat == "max":
            return max(self.values[i0:])
        if stat == "min":
            return min(self.values[i0:])
        # mean: ∫ from start to the last sample over that span
        span = times[-1] - start
        if span <= EPS_S:
            return self.values[-1]
        below = self.cum[i0 - 1] + self.values[i0] * (start - times[i0 - 1]) if i0 > 0 else self.cum[0]
        return (self.cum[-1] - below) / span
