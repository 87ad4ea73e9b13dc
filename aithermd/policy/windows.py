"""Time-weighted windows over one metric: mean, min and max over the last ``window_s`` seconds.

Pure values: :meth:`Window.push` returns a new window and never changes what an existing window holds. A
sample's value covers the interval since the previous sample (a "right step", as NVML utilization and
averaged power are reported), so gaps in time are weighted by their length. A window statistic is known
only once the history reaches back ``window_s``.

Windows share an append-only buffer (the newest view appends in place, an older view copies first), so a
push costs O(1) amortized while every view stays immutable to its holders.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

EPS_S = 1e-6


class _Buf:
    __slots__ = ("cum", "times", "values")

    def __init__(self, times: list[float], values: list[float], cum: list[float]) -> None:
        self.times, self.values, self.cum = times, values, cum


class Window:
    """A view [start, end) of a shared buffer of samples: times (s, increasing), values and ``cum``
    (∫ value dt from the buffer's first sample)."""

    __slots__ = ("_buf", "_end", "_start")

    def __init__(self, buf: _Buf | None = None, start: int = 0, end: int = 0) -> None:
        self._buf = buf if buf is not None else _Buf([], [], [])
        self._start, self._end = start, end

    @property
    def times(self) -> tuple[float, ...]:
        return tuple(self._buf.times[self._start:self._end])

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(self._buf.values[self._start:self._end])

    @property
    def last_t(self) -> float | None:
        return self._buf.times[self._end - 1] if self._end > self._start else None

    def __len__(self) -> int:
        return self._end - self._start

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Window) and self.times == other.times and self.values == other.values

    def __hash__(self) -> int:
        return hash((self.times, self.values))

    def __repr__(self) -> str:
        return f"Window({len(self)} samples, last_t={self.last_t})"

    def push(self, t: float, value: float, horizon_s: float) -> Window:
        """A new window with (t, value) appended, keeping what ``horizon_s`` needs (one sample at or before
        ``t − horizon_s`` stays as the boundary). A time not after the last sample changes nothing."""
        buf, start, end = self._buf, self._start, self._end
        if end > start and t <= buf.times[end - 1]:
            return self
        if len(buf.times) != end or start > 256 and start > (end - start):
            # not the newest view (or mostly dead prefix): copy the live part into a fresh buffer
            buf = _Buf(buf.times[start:end], buf.values[start:end],
                       [c - buf.cum[start] for c in buf.cum[start:end]] if end > start else [])
            start, end = 0, end - start
        c = buf.cum[end - 1] + value * (t - buf.times[end - 1]) if end > start else 0.0
        buf.times.append(t)
        buf.values.append(value)
        buf.cum.append(c)
        end += 1
        k = bisect_right(buf.times, t - horizon_s + EPS_S, start, end) - 1
        if k > start:
            start = k
        return Window(buf, start, end)

    def stat(self, stat: str, window_s: float, now: float) -> float | None:
        """``stat`` ("mean" | "min" | "max" | "last") over (now − window_s, now]; None when the history does
        not reach back that far or holds no sample inside the window."""
        start, end = self._start, self._end
        if end <= start:
            return None
        buf = self._buf
        times, values = buf.times, buf.values
        if stat == "last" or window_s <= 0:
            return values[end - 1]
        lo = now - window_s
        if times[start] > lo + EPS_S:
            return None
        i0 = bisect_right(times, lo + EPS_S, start, end)
        if i0 >= end:
            return None
        if stat == "max":
            return max(values[i0:end])
        if stat == "min":
            return min(values[i0:end])
        span = times[end - 1] - lo
        if span <= EPS_S:
            return values[end - 1]
        cum = buf.cum
        below = cum[i0 - 1] + values[i0] * (lo - times[i0 - 1])  # i0 > start: times[start] ≤ lo
        return (cum[end - 1] - below) / span

    def held_s(self, ok: Callable[[float], bool], window_s: float, now: float) -> float:
        """How long (s, at most ``window_s``) every sample up to ``now`` has met ``ok``: ``now`` minus the
        time of the newest sample that did not (its value covers the time before it), or minus the oldest
        sample's time while the history is shorter than the window. So ``max < X`` over the window holds
        once this reaches ``window_s``; 0.0 when empty. Walks back only over the samples that met ``ok``."""
        start, end = self._start, self._end
        times, values = self._buf.times, self._buf.values
        lo = now - window_s
        i = end - 1
        while i >= start and times[i] > lo + EPS_S and ok(values[i]):
            i -= 1
        if i < start:
            return max(0.0, now - times[start]) if end > start else 0.0
        if times[i] <= lo + EPS_S:  # every sample inside the window met it
            return window_s
        return max(0.0, now - times[i])

    def mean_upto(self, window_s: float, now: float) -> float | None:
        """Time-weighted mean over (now − window_s, now], or over the whole history while it is shorter
        (a fresh window: the mean of what it holds; one sample: that value). None when empty."""
        if self._end <= self._start:
            return None
        span = min(window_s, now - self._buf.times[self._start])
        return self.stat("mean", span, now) if span > EPS_S else self._buf.values[self._end - 1]
