"""TracePlot: a small plot of one series over the last minutes as bars in eighth blocks, with an optional
second series (a limit) drawn as a line over them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

_BLOCKS = " ▁▂▃▄▅▆▇█"
HOLD_S = 15.0  # the daemon rate-limits SnapshotUpdated: bridge sample gaps up to this long


def bucket(points: Sequence[tuple[float, float | None]], columns: int, t_end: float, span_s: float,
           pick: str = "max", hold_s: float = 0.0) -> list[float | None]:
    """Resample ``(t, v)`` points into ``columns`` equal time buckets ending at ``t_end``; each bucket
    keeps the max (or the last) of its values, None when it has none. An empty bucket less than ``hold_s``
    after a real value keeps that value (samples sparser than the columns draw as steps, not stripes); a
    None point is a gap and is never bridged."""
    out: list[float | None] = [None] * columns
    if columns <= 0:
        return out
    start = t_end - span_s
    width_s = span_s / columns
    filled = [False] * columns
    last: tuple[float, float | None] | None = None
    for t, v in points:
        if t < start:
            last = (t, v)
            continue
        col = min(columns - 1, int((t - start) / width_s))
        _hold(out, filled, last, start, width_s, col, hold_s)
        last = (t, v)
        if v is None:
            continue
        if not filled[col] or pick == "last" or (pick == "max" and v > out[col]):
            out[col] = v
            filled[col] = True
    _hold(out, filled, last, start, width_s, columns, hold_s)
    return out


def _hold(out: list[float | None], filled: list[bool], last: tuple[float, float | None] | None,
          start: float, width_s: float, upto: int, hold_s: float) -> None:
    """Fill empty columns before ``upto`` with the last value while within ``hold_s`` of it."""
    if last is None or last[1] is None or hold_s <= 0:
        return
    first = max(0, int((last[0] - start) / width_s) + 1)
    for col in range(first, upto):
        if filled[col] or start + col * width_s - last[0] > hold_s:
            break
        out[col] = last[1]


def plot_lines(values: Sequence[float | None], line: Sequence[float | None] | None, height: int,
               ymax: float) -> list[Text]:
    """``height`` rows of text (top first) plotting ``values`` as bars and ``line`` as ``━``."""
    rows = [Text() for _ in range(height)]
    ymax = ymax or 1.0
    for col, v in enumerate(values):
        level = 0 if v is None else round(max(0.0, min(1.0, v / ymax)) * height * 8)
        lim = line[col] if line is not None and col < len(line) else None
        lim_row = None if lim is None else min(height - 1, int(max(0.0, lim / ymax) * height))
        for r in range(height):  # r = 0 is the bottom row
            cell = max(0, min(8, level - r * 8))
            row = rows[height - 1 - r]
            if lim_row == r:
                row.append("━", style="bold yellow")
            elif v is None and r == 0:
                row.append("·", style="dim")
            else:
                row.append(_BLOCKS[cell], style="green")
    return rows


class TracePlot(Widget):
    """Set :meth:`set_series`; the title shows what, the newest value and the scale."""

    DEFAULT_CSS = "TracePlot { height: 6; border: round $secondary; }"
    values: reactive[tuple] = reactive((), layout=False)

    def __init__(self, title: str, unit: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title, self.unit = title, unit
        self._points: Sequence[tuple[float, float | None]] = ()
        self._line: Sequence[tuple[float, float | None]] = ()
        self._t_end, self._span_s, self._ymax = 0.0, 300.0, 1.0

    def set_series(self, points: Sequence[tuple[float, float | None]],
                   line: Sequence[tuple[float, float | None]] = (), *, span_s: float = 300.0,
                   floor: float = 1.0, hint: str = "") -> None:
        """``points`` and ``line`` as ``(wall s, value)``; ``floor`` is the smallest full scale; ``hint``
        (keys) ends the subtitle."""
        self._points, self._line, self._span_s = points, line, span_s
        self._t_end = max((t for t, _ in (*points[-1:], *line[-1:])), default=0.0)
        seen = [v for _, v in (*points, *line) if v is not None]
        self._ymax = max([floor, *seen]) * 1.05
        newest = next((v for _, v in reversed(points) if v is not None), None)
        lim = next((v for _, v in reversed(line) if v is not None), None)
        tail = f" · limit {lim:.0f} {self.unit} ━" if lim is not None else ""
        now = f"{newest:.0f} {self.unit}" if newest is not None else "—"
        self.border_title = f"{self.title} {now}{tail}"
        self.border_subtitle = f"0–{self._ymax:.0f} {self.unit} · {self._span_s / 60:g} min" + \
            (f" · {hint}" if hint else "")
        self.values = (tuple(points), tuple(line), span_s)

    def render(self) -> Text:
        width, height = self.content_size.width, self.content_size.height
        if width <= 0 or height <= 0:
            return Text()
        values = bucket(self._points, width, self._t_end, self._span_s, hold_s=HOLD_S)
        line = bucket(self._line, width, self._t_end, self._span_s, "last", HOLD_S) if self._line else None
        return Text("\n").join(plot_lines(values, line, height, self._ymax))
