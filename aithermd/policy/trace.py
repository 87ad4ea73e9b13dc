"""``nvidia-smi --query-gpu=... --format=csv`` traces, in their real variants.

- a header names the fields, with or without units (``power.draw [W]``; ``--format=csv,nounits``);
  any order and subset; values with or without units (``33.09 W``), ``[N/A]``/``[Not Supported]`` as unknown;
- with an ``index``/``uuid``/``pci.bus_id`` column each row names its GPU, and a sample ends when a GPU
  repeats; without one, each sample lists the GPUs in order, and the number of GPUs is the one that
  explains the whole trace best (:mod:`aithermd.policy.trace_gpus`: static columns, the gaps between and
  inside samples, and each GPU's continuity), so rows of one sample read tenths of a second apart, or
  samples less than a second apart, still give the right count;
- ``timestamp`` as nvidia-smi prints it (``2026/01/03 15:36:53.507``) or ISO 8601; without it samples are
  taken 1 s apart. Gaps in time are kept; time must not go backwards.

Malformed input raises :class:`TraceError` with the 1-based line number.
"""

from __future__ import annotations

import csv
import datetime
import math
import os
import re
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

from aithermd.errors import AithermError
from aithermd.files import read_regular
from aithermd.policy.trace_gpus import count_gpus

ID_COLUMNS = ("index", "uuid", "pci.bus_id", "gpu_bus_id")
# fields read as numbers (a value that is neither a number nor an unknown marker is malformed); every other
# column is kept as text
NUMERIC = frozenset({"power.draw", "power.limit", "enforced.power.limit", "power.default_limit",
                     "power.min_limit", "power.max_limit", "temperature.gpu", "temperature.memory",
                     "utilization.gpu", "utilization.memory", "fan.speed", "clocks.sm", "clocks.mem",
                     "clocks.gr", "memory.used", "memory.total", "memory.free"})
ALIASES = MappingProxyType({
    "power.draw.average": "power.draw", "power.draw.instant": "power.draw", "gpu_name": "name",
    "clocks.current.sm": "clocks.sm", "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr", "gpu_bus_id": "pci.bus_id",
    "enforced.power.limit": "enforced.power.limit", "power.management.limit": "power.limit"})
UNKNOWN = frozenset({"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]",
                     "[insufficient permissions]", "[not available]", ""})
FAILED = frozenset({"[unknown error]", "[gpu is lost]"})
_TS = re.compile(r"^\s*(\d{4})[/-](\d{1,2})[/-](\d{1,2})[ T](\d{1,2}):(\d{2}):(\d{2})(\.\d+)?"
                 r"\s*(Z|[+-]\d{2}:?\d{2})?\s*$")
# no nvidia-smi field comes near this (W, %, °C, MHz, MiB): a value beyond it is garbage, and would turn
# the replay's energy sums into infinities
MAX_VALUE = 1e7
PERCENT_FIELDS = ("utilization.", "fan.speed")  # nvidia-smi's shares of 100 %: 5000 % is a broken line
MIN_STEP_S = 0.04  # samples closer than this are left out when estimating the period
# The unit nvidia-smi writes after each numeric field's value (none with --format=csv,nounits); any other text
# there is a malformed line (a "17.53 kW" read as 17.53 W before)
UNITS = (("power.", "W"), ("enforced.", "W"), ("utilization.", "%"), ("fan.", "%"), ("memory.", "MiB"),
         ("clocks.", "MHz"), ("temperature.", "C"))
_UNIT = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*(%|[A-Za-z°]*)\s*")
SHARED_MAX = 65_536  # distinct value texts and text rows shared between a trace's rows, at most
_MISSING = object()
_NONE_FAILED: frozenset[str] = frozenset()


class TraceError(AithermError):
    """A malformed trace: ``line`` (1-based) and ``message``."""

    def __init__(self, line: int, message: str, path: str = "") -> None:
        self.line, self.message, self.path = line, message, path
        super().__init__(f"{path + ':' if path else 'line '}{line}: {message}")


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU in one sample: numeric fields (None = unknown), text fields, failed fields, the source line.
    ``text`` is shared by the rows with the same texts: read it, never change it."""

    values: dict[str, float | None]
    text: dict[str, str]
    failed: frozenset[str]
    line: int


@dataclass(frozen=True, slots=True)
class TraceSample:
    t: float  # s since the first sample
    t_wall: float  # local wall-clock time (s since the epoch); 0-based when the trace has no timestamp
    gpus: tuple[GpuRow | None, ...]  # by GPU order in the trace; None where a sample lacks that GPU
    line: int


@dataclass(frozen=True)
class Trace:
    fields: tuple[str, ...]  # normalized field names, in column order
    gpu_ids: tuple[str, ...]  # per GPU: its index/uuid value, or its position
    names: tuple[str | None, ...]  # per GPU: the ``name`` column, when present
    samples: list[TraceSample] = field(repr=False)
    period_s: float = 1.0


def normalize(header: str) -> tuple[str, str | None]:
    """``"power.draw [W]"`` → ``("power.draw", "W")``; aliases folded."""
    text = header.strip()
    unit = None
    m = re.match(r"^(.*?)\s*\[(.*)\]\s*$", text)
    if m:
        text, unit = m.group(1), m.group(2)
    text = text.strip().lower()
    return ALIASES.get(text, text), unit


def parse_time(text: str, line: int, cache: dict[str, float] | None = None) -> float:
    """A timestamp → local epoch seconds. ``cache`` (per parse) maps the text up to the second to its value.
    Raises TraceError."""
    text = text.strip()
    head, rest = text[:19], text[19:]
    if cache is not None:
        base = cache.get(head)
        if base is not None and (not rest or rest[0] == "." and rest[1:].strip().isdigit()):
            return base + (float(rest) if rest else 0.0)
    m = _TS.match(text)
    if not m:
        raise TraceError(line, f"timestamp '{text.strip()}' is not 'YYYY/MM/DD HH:MM:SS[.fff]' or ISO 8601")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    if h > 23 or mi > 59 or s > 60:
        raise TraceError(line, f"timestamp '{text.strip()}' has an impossible time of day")
    try:
        datetime.date(y, mo, d)  # mktime would silently roll 2025/02/30 over to March
    except ValueError:
        raise TraceError(line, f"timestamp '{text.strip()}' has an impossible date") from None
    try:
        base = time.mktime((y, mo, d, h, mi, s, 0, 0, -1))
    except (OverflowError, ValueError) as exc:
        raise TraceError(line, f"timestamp '{text.strip()}': {exc}") from None
    if cache is not None and len(head) == 19 and not m.group(8) and len(cache) < 100_000:
        cache[head] = base
    return base + (float(m.group(7)) if m.group(7) else 0.0)


def _unit_of(raw: str) -> str:
    """The text after the number of a value (``33.09 W`` → ``W``, ``45`` → ``""``); ``?`` for anything that is
    no unit (``33 garbage words``)."""
    m = _UNIT.fullmatch(raw)
    return m.group(1) if m else "?"


def _number(raw: str, column: str, line: int) -> tuple[float | None, bool]:
    """(value, failed). Raises TraceError for text that is neither a number nor an unknown marker, and for a
    number no nvidia-smi field can hold (negative where only temperatures may be, or beyond MAX_VALUE)."""
    try:  # ASCII digits only, as nvidia-smi writes them (float() also takes other scripts' digits)
        value = float(raw.split(None, 1)[0]) if raw.isascii() else math.nan
    except (ValueError, IndexError):
        value = math.nan
    if value - value != 0.0:  # not a plain finite number: an unknown marker, 50%, or garbage
        text = raw.strip()
        low = text.lower()
        if low in UNKNOWN:
            return None, low in FAILED
        head = text.split(" ", 1)[0].rstrip("%")
        try:
            if not head.isascii():
                raise ValueError(head)
            value = float(head)
        except ValueError:
            raise TraceError(line, f"{column}: '{text}' is not a number") from None
        if value - value != 0.0:
            raise TraceError(line, f"{column}: '{text}' is not a finite number")
    unit = _unit_of(raw)
    if unit and unit != next((u for prefix, u in UNITS if column.startswith(prefix)), unit):
        expected = dict(UNITS)[column.split(".")[0] + "."]
        raise TraceError(line, f"{column}: '{raw.strip()}' is not in {expected}, as nvidia-smi writes it: "
                               "fix or delete the line")
    low_end = -MAX_VALUE if column.startswith("temperature.") else 0.0
    high_end = 100.0 if column.startswith(PERCENT_FIELDS) else MAX_VALUE
    if not low_end <= value <= high_end:
        raise TraceError(line, f"{column}: '{raw.strip()}' is out of range "
                               f"({low_end:.0f} to {high_end:.0f}): fix or delete the line")
    return value, False


def _rows(lines: Iterable[str]) -> Iterable[tuple[int, list[str]]]:
    """(1-based line where the row starts, fields). Raises TraceError for what the csv module refuses."""
    reader = csv.reader(lines)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(max(reader.line_num, start), f"CSV: {exc}") from None
        if not row or (len(row) == 1 and not row[0].strip()) or row[0].lstrip().startswith("#"):
            continue
        yield start, row


def read_trace_text(path: str | os.PathLike[str], errors: str = "strict") -> str:
    """The text of a trace file. Raises OSError when it cannot be read or is not a regular file (a FIFO
    would block for ever, ``/dev/zero`` never end), TraceError with the line of the first byte that is not
    UTF-8 (with ``errors="strict"``)."""
    raw = read_regular(path)
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise TraceError(raw.count(b"\n", 0, exc.start) + 1, f"not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})", str(path)) from None


def parse_trace(text: str, path: str = "") -> Trace:
    """Parse a whole trace. Raises TraceError (line number and what is wrong)."""
    try:
        return _parse(text.splitlines())
    except TraceError as exc:
        raise TraceError(exc.line, exc.message, path) from None


def _parse(lines: list[str]) -> Trace:
    rows = _rows(lines)
    first = next(rows, None)
    if first is None:
        raise TraceError(1, "empty trace: expected a header line (nvidia-smi --query-gpu=... --format=csv)")
    hline, header = first
    fields = tuple(normalize(h)[0] for h in header)
    known = [f for f in fields if "." in f or f in ("timestamp", "index", "uuid", "name", "pstate")]
    if not known or any(re.match(r"^-?\d", f) for f in fields):
        raise TraceError(hline, "no header line: the first line must name the fields "
                                "(nvidia-smi --query-gpu=... --format=csv)")
    if len(set(fields)) != len(fields):
        dup = next(f for f in fields if fields.count(f) > 1)
        raise TraceError(hline, f"column '{dup}' appears twice")
    if not {"power.draw", "utilization.gpu", "temperature.gpu"} & set(fields):
        raise TraceError(hline, "none of power.draw, utilization.gpu, temperature.gpu is in the header")
    id_col = next((fields.index(c) for c in ID_COLUMNS if c in fields), None)
    ts_col = fields.index("timestamp") if "timestamp" in fields else None
    numeric = [(i, f) for i, f in enumerate(fields) if f in NUMERIC]
    texts = [(i, f) for i, f in enumerate(fields) if f not in NUMERIC and f != "timestamp"]
    parsed: list[tuple[float | None, str | None, GpuRow]] = []
    fractional = False  # a stamp written with fractions of a second
    last_t = None
    stamps: dict[str, float] = {}
    # A long trace repeats itself: rows share one text mapping, one float per distinct value text and the
    # empty set of failed fields, so its memory follows its samples, not its bytes (attack4 B8: 81 MB of
    # trace took 1.58 GB; each row held its own strings and dicts)
    shared_text: dict[tuple[str, ...], dict[str, str]] = {}
    shared_values: dict[tuple[str, str], float | None] = {}
    for lineno, row in rows:
        if len(row) != len(fields):
            raise TraceError(lineno, f"expected {len(fields)} fields as in the header, found {len(row)}")
        t = parse_time(row[ts_col], lineno, stamps) if ts_col is not None else None
        if t is not None and not fractional:
            fractional = "." in row[ts_col].strip()[17:]
        if t is not None and last_t is not None and t < last_t - 1e-3:
            raise TraceError(lineno, "time goes backwards")
        if t is not None:
            last_t = t
        values: dict[str, float | None] = {}
        failed = set()
        for i, f in numeric:
            raw = row[i]
            v = shared_values.get((f, raw), _MISSING)
            if v is _MISSING:
                v, bad = _number(raw, f, lineno)
                if bad:
                    failed.add(f)
                elif len(shared_values) < SHARED_MAX:
                    shared_values[(f, raw)] = v
            values[f] = v
        key = tuple(row[i] for i, _f in texts)
        text = shared_text.get(key)
        if text is None:
            text = {f: row[i].strip() for i, f in texts}
            if len(shared_text) < SHARED_MAX:
                shared_text[key] = text
        gpu_row = GpuRow(values, text, frozenset(failed) if failed else _NONE_FAILED, lineno)
        parsed.append((t, row[id_col].strip() if id_col is not None else None, gpu_row))
    if not parsed:
        raise TraceError(hline + 1, "no samples after the header")
    return _group(fields, parsed, id_col is not None, ts_col is not None, fractional)


def _group(fields: tuple[str, ...], parsed: list, by_id: bool, timed: bool, fractional: bool) -> Trace:
    groups: list[list[tuple[float | None, str | None, GpuRow]]] = []
    order: dict[str, int] = {}
    period = 1.0
    if by_id:
        current: list = []
        seen: set[str] = set()
        for item in parsed:
            if item[1] in seen:
                groups.append(current)
                current, seen = [], set()
            seen.add(item[1])
            order.setdefault(item[1], len(order))
            current.append(item)
        groups.append(current)
    else:
        times = [item[0] for item in parsed] if timed else None
        n = count_gpus([(item[2].values, item[2].text) for item in parsed], times, fractional)
        groups = [parsed[k:k + n] for k in range(0, len(parsed), n)]
    n_gpus = len(order) if by_id else max(len(g) for g in groups)
    t0 = groups[0][0][0] if timed else 0.0
    samples = []
    for k, g in enumerate(groups):
        gpus: list[GpuRow | None] = [None] * n_gpus
        for pos, (_t, ident, row) in enumerate(g):
            gpus[order[ident] if by_id else pos] = row
        t_abs = g[0][0] if timed else float(k)
        samples.append(TraceSample(t=t_abs - t0, t_wall=t_abs, gpus=tuple(gpus), line=g[0][2].line))
    if timed and len(samples) > 1:
        steps = [b.t - a.t for a, b in zip(samples, samples[1:], strict=False) if b.t - a.t >= MIN_STEP_S]
        period = statistics.median(steps) if steps else 1.0
    ids = tuple(sorted(order, key=order.get)) if by_id else tuple(str(i) for i in range(n_gpus))
    names = []
    for i in range(n_gpus):
        name = next((s.gpus[i].text.get("name") for s in samples if s.gpus[i] is not None), None)
        names.append(name or None)
    return Trace(fields, ids, tuple(names), samples, period)


GAP_MIN_S = 60.0  # an interval this long is a gap whatever the period (nvidia-smi -l logs every 1-60 s)
GAP_PERIODS = 10  # ... or this many of the trace's own sampling periods
GAP_MAX_S = 3600.0  # ... but never more: a trace of a few samples a year apart has a "period" of a year


def gap_s(period_s: float) -> float:
    """The longest interval (s) between two samples that still counts as recorded: ``GAP_PERIODS`` of the
    trace's period ``period_s`` (s), at least ``GAP_MIN_S``, at most ``GAP_MAX_S``. Longer, the logger
    stopped."""
    return min(GAP_MAX_S, max(GAP_MIN_S, GAP_PERIODS * period_s))


def gaps(trace: Trace) -> list[dict[str, float]]:
    """The intervals over :func:`gap_s` of ``trace``'s period, as ``{"after_line", "line", "seconds"}``
    (the 1-based lines of the samples on either side, and the interval in s)."""
    longest = gap_s(trace.period_s)
    return [{"after_line": a.line, "line": b.line, "seconds": round(b.t - a.t, 3)}
            for a, b in zip(trace.samples, trace.samples[1:], strict=False) if b.t - a.t > longest]


def span_text(seconds: float) -> str:
    """``seconds`` in the largest unit that fits twice: 90 s, 3.5 h, 365 d."""
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"
