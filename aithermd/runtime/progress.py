"""Jobs' own progress rates, reported over D-Bus, as readings the efficient-limit search reads.

``aithermctl run --progress-regex REGEX -- CMD`` reads the step counters or it/s a training loop already
prints and calls ``ReportProgress(gpus, rate)`` (steps per second, the GPUs the job runs on) about every few
seconds. Each report holds for :data:`FRESH_S`; the tick adds ``gpu<N>/progress_rate`` readings for the GPUs
with a fresh one. A job that stops reporting (ended, or its output went quiet) leaves no reading: the search
then falls back to a signal NVML shows, or goes back to the default limit if its own signal was this one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from aithermd.errors import InvalidArgument
from aithermd.model import Reading

FRESH_S = 30.0
CHANNEL = "progress_rate"
MAX_RATE = 1e9
MAX_GPUS = 64  # more GPU names than any one box has is a broken caller


class Progress:
    """The latest report per GPU: (steps per second, monotonic time of the report)."""

    def __init__(self) -> None:
        self._rates: dict[str, tuple[float, float]] = {}

    def report(self, gpus: Iterable[str], rate: float, now: float, known: Iterable[str]) -> list[str]:
        """Record ``rate`` (steps/s, finite, ≥ 0) for ``gpus`` (device ids, at least one, each known).
        Returns the GPUs recorded. Raises InvalidArgument."""
        ids = list(dict.fromkeys(gpus))
        if not ids:
            raise InvalidArgument("name at least one GPU (gpu0, gpu1, ...)")
        if len(ids) > MAX_GPUS:
            raise InvalidArgument(f"{len(ids)} GPU names: name at most {MAX_GPUS}, the GPUs the job runs on")
        unknown = sorted(set(ids) - set(known))
        if unknown:
            here = ", ".join(sorted(known)) or "none"
            shown = ", ".join(repr(u)[:40] for u in unknown[:4]) + (f" and {len(unknown) - 4} more"
                                                                     if len(unknown) > 4 else "")
            raise InvalidArgument(f"no GPU {shown} here; known: {here}")
        if not math.isfinite(rate) or not 0 <= rate <= MAX_RATE:
            raise InvalidArgument(f"a progress rate is a finite number of steps per second ≥ 0, got {rate!r}")
        for gpu in ids:
            self._rates[gpu] = (float(rate), now)
        return ids

    def readings(self, now: float) -> Mapping[str, Reading]:
        """``gpu<N>/progress_rate`` for every GPU with a report younger than :data:`FRESH_S`."""
        out = {}
        for gpu, (rate, t) in list(self._rates.items()):
            if now - t > FRESH_S:
                del self._rates[gpu]
                continue
            cid = f"{gpu}/{CHANNEL}"
            out[cid] = Reading(cid, rate)
        return out
