"""How many GPUs a trace without an ``index``/``uuid``/``pci.bus_id`` column has.

``nvidia-smi --query-gpu=... --format=csv -l 1`` prints one row per GPU per sample, in GPU order, each row
stamped when *its* GPU was read: rows of one sample can be tenths of a second apart on a busy machine, and
samples arrive irregularly (a logger loop that sleeps 1 s after a slow query, or ``-lms``), sometimes less
than a second after the previous one. Grouping rows by time thresholds then splits samples or merges two
(a 4-GPU log read as 8 GPUs, or as 1). Here the count is the one that explains the whole trace best:

1. **static columns** (``name``, ``serial``, ``vbios_version``, ``memory.total``, the limits' constraints,
   …) repeat every N rows: a count they contradict is out;
2. **time**: with N right, every gap between the last row of a sample and the first of the next is longer
   than the gaps inside samples (compared robustly: the 10th percentile of the one at least twice the
   90th of the other); a count that gives no such decisive contrast gets no support from time;
3. **values**: a GPU's own readings change little from one sample to the next, so rows N apart differ less
   than rows of different GPUs (the mean normalized difference at lag N); the counts whose rows N apart
   are clearly more alike than the rest are supported (a multiple of the true count compares a GPU with
   itself a few samples later: as alike), the smallest one wins.

0. **one row per stamp**: when at least three rows in four come half a second or more after the previous one,
   no sample holds several rows (nvidia-smi reads every GPU of a sample within tenths of a second, and
   with N ≥ 2 GPUs at least half of the gaps are inside a sample): one GPU, whatever its values do. A
   load that switches every few seconds makes rows N apart alike, and the values alone would read a
   single card as N.

With stamps written to fractions of a second, time decides (GPUs that read alike fool the values: two
rows of one sample are as alike as one card a second apart), helped by the values among the counts it
supports; with whole-second stamps the values decide (two samples in one second look like one sample of
twice the GPUs), time only where the values cannot. Without support from either, runs of identical stamps
decide.

Rows are then taken N at a time; a last, incomplete sample keeps the GPUs it has.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

MAX_GPUS = 16
STATIC_TEXT = ("name", "serial", "vbios_version", "driver_version", "pci.device_id", "gpu_name")
STATIC_NUMERIC = ("memory.total", "power.default_limit", "power.min_limit", "power.max_limit")
DYNAMIC_NUMERIC = ("temperature.gpu", "temperature.memory", "power.draw", "memory.used", "memory.free",
                   "clocks.sm", "clocks.mem", "clocks.gr", "utilization.gpu", "utilization.memory",
                   "fan.speed")
STATIC_AGREEMENT = 0.95  # share of rows N apart whose static columns must agree
MIN_SAMPLES = 4  # samples needed before the gaps between them count as evidence
VALUE_SEPARATION = 1.5  # rows N apart of the same GPU must be this much more alike than of different GPUs
ONE_SAMPLE_GAP_S = 0.5  # rows this far apart are different samples (the module doc, rule 0)


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(q * len(values))))]


def _static_ok(rows: Sequence[tuple[dict, dict]], n: int) -> bool:
    agree = total = 0
    for i in range(len(rows) - n):
        (num_a, text_a), (num_b, text_b) = rows[i], rows[i + n]
        for key in STATIC_TEXT:
            a, b = text_a.get(key), text_b.get(key)
            if a and b:
                total += 1
                agree += a == b
        for key in STATIC_NUMERIC:
            a, b = num_a.get(key), num_b.get(key)
            if a is not None and b is not None:
                total += 1
                agree += a == b
    return total == 0 or agree >= STATIC_AGREEMENT * total


def _time_score(times: Sequence[float], n: int) -> float | None:
    """For rows taken n ≥ 2 at a time: q10 of the gaps between samples minus q90 of the gaps inside them,
    when that is decisive (positive, the between-gaps at least twice the inside ones, and at least
    :data:`MIN_SAMPLES` samples to judge by); None otherwise. One GPU has no gaps inside a sample to
    contrast: time alone never argues for it."""
    if n < 2:
        return None
    between, inside = [], []
    for i in range(len(times) - 1):
        (between if (i + 1) % n == 0 else inside).append(times[i + 1] - times[i])
    if len(between) < MIN_SAMPLES or not inside:
        return None
    lo_between, hi_inside = _quantile(between, 0.1), _quantile(inside, 0.9)
    if lo_between <= 0 or lo_between < 2.0 * hi_inside:
        return None
    return lo_between - hi_inside


def _value_distance(rows: Sequence[tuple[dict, dict]], n: int, scales: dict[str, float]) -> float | None:
    total, count = 0.0, 0
    for i in range(len(rows) - n):
        a, b = rows[i][0], rows[i + n][0]
        for key, scale in scales.items():
            va, vb = a.get(key), b.get(key)
            if va is not None and vb is not None:
                total += abs(va - vb) / scale
                count += 1
    return total / count if count else None


def _scales(rows: Sequence[tuple[dict, dict]]) -> dict[str, float]:
    out = {}
    for key in DYNAMIC_NUMERIC:
        values = [r[0][key] for r in rows if r[0].get(key) is not None]
        if len(values) < 4:
            continue
        spread = _quantile(values, 0.9) - _quantile(values, 0.1)
        if spread > 0:
            out[key] = spread
    return out


def count_gpus(rows: Sequence[tuple[dict, dict]], times: Sequence[float] | None,
               sub_second: bool) -> int:
    """The number of GPUs of a trace whose rows are ``rows`` ((numeric values, text values) per row, in
    file order) stamped ``times`` (s, or None without a timestamp column); ``sub_second`` whether the
    stamps are written with fractions of a second. See the module docstring."""
    m = len(rows)
    if m <= 1:
        return 1
    candidates = [n for n in range(1, min(MAX_GPUS, m) + 1) if _static_ok(rows, n)] or [1]
    if 1 in candidates and times is not None and m > 2:
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        if _quantile(gaps, 0.25) >= ONE_SAMPLE_GAP_S:
            return 1
    by_time: set[int] | None = None
    if times is not None and m > 2:
        scored = {n: _time_score(times, n) for n in candidates}
        valid = {n: s for n, s in scored.items() if s is not None}
        best = max(valid.values(), default=0.0)
        if best > 0:
            by_time = {n for n, s in valid.items() if s >= 0.9 * best}
    by_value: set[int] | None = None
    scales = _scales(rows)
    known = {n: d for n in candidates if (d := _value_distance(rows, n, scales)) is not None}
    by_value = _alike(known)
    if by_value and not sub_second:  # whole seconds: two samples in one second look like twice the GPUs
        return min(by_value)
    if by_time:
        return min(by_time & by_value) if by_value and by_time & by_value else min(by_time)
    if by_value:
        return min(by_value)
    if times is not None and len(candidates) > 1:
        return _by_identical_stamps(times, candidates)
    return min(candidates)


def _alike(distances: dict[int, float]) -> set[int] | None:
    """The counts whose rows N apart are alike: those below the widest relative jump in the sorted
    distances, when that jump is a clear one (× :data:`VALUE_SEPARATION`); None when the values do not
    separate (GPUs that read alike, or too few samples)."""
    ranked = sorted(distances.items(), key=lambda kv: kv[1])
    best_ratio, cut = 1.0, None
    for i in range(len(ranked) - 1):
        lo, hi = ranked[i][1], ranked[i + 1][1]
        ratio = hi / lo if lo > 0 else (float("inf") if hi > 0 else 1.0)
        if ratio > best_ratio:
            best_ratio, cut = ratio, i + 1
    if cut is None or best_ratio < VALUE_SEPARATION:
        return None
    return {n for n, _d in ranked[:cut]}


def _by_identical_stamps(times: Sequence[float], candidates: Sequence[int]) -> int:
    """When neither time gaps nor values decide: the most common run length of identical stamps, if it
    is a candidate, else the smallest candidate."""
    runs, run = [], 1
    for a, b in zip(times, times[1:], strict=False):
        if b == a:
            run += 1
        else:
            runs.append(run)
            run = 1
    runs.append(run)
    common = statistics.mode(runs)
    return common if common in candidates else min(candidates)
