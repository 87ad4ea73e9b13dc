"""The Zeus power-limit sweeps: real DNN training runs measured at power limits 25 W apart.

Source: the trace files published with the Zeus paper (J. You, J.-W. Chung, M. Chowdhury, "Zeus:
Understanding and Optimizing GPU Energy Consumption of DNN Training", NSDI '23), repository ml-energy/zeus,
``examples/research_reproducibility/zeus_nsdi23/trace/summary_power_{a40,v100,rtx6000}.csv`` @ 75a8b93
(Apache-2.0); copied to ``tests/fixtures/zeus-power-limit/`` (origin in the project's realdata SOURCES.md).
Columns: ``dataset,network,batch_size,optimizer,power_limit`` (W), ``time_per_epoch`` (s),
``average_power`` (W). Throughput at a limit = 1 / time per epoch.

Each training configuration becomes a :class:`Sweep`, normalized against the job's **own draw**: the
median mean power (and median epoch time) over the limits at least :data:`UNBOUND_RATIO` × the draw at the
highest limit, where the cap cannot bind (the single top point alone is as noisy as any other: ±1 % on
large jobs, ±5 % on small ones). ``x`` = limit / own draw, ``u`` = mean power / own draw, ``r`` =
throughput / unbound throughput. Pure standard library: the simulator's tests and the offline fit
(``scripts/fit-sim-law``) read the same numbers.
"""

from __future__ import annotations

import csv
import math
import statistics
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

UNBOUND_RATIO = 1.25  # limits this far above the top-limit draw never bind (Zeus data: r = 1.000 median)
BINDS_BELOW_X = 0.9  # a configuration the law is fitted on has a limit under 0.9 × its own draw
HOLDOUT_MOD = 4  # held out: crc32(key) % 4 == 0 (about a quarter, fixed by the key, never by chance)
FILES = {"a40": "a40-training-power-limit-sweep.csv", "v100": "v100-pcie-training-power-limit-sweep.csv",
         "rtx6000": "quadro-rtx6000-training-power-limit-sweep.csv"}


@dataclass(frozen=True, slots=True)
class Sweep:
    """One training configuration: ``key`` ("a40/cifar100/shufflenetv2/1024/adadelta"), its own draw
    ``draw_w`` (W), the card's highest swept limit ``max_limit_w``, and per swept limit (ascending) ``x``,
    ``u``, ``r`` as in the module docstring."""

    key: str
    gpu: str
    draw_w: float
    max_limit_w: float
    limits_w: tuple[float, ...]
    x: tuple[float, ...]
    u: tuple[float, ...]
    r: tuple[float, ...]

    @property
    def binds(self) -> bool:
        """Whether any swept limit is below :data:`BINDS_BELOW_X` × the job's own draw."""
        return min(self.x) < BINDS_BELOW_X

    @property
    def held_out(self) -> bool:
        return zlib.crc32(self.key.encode()) % HOLDOUT_MOD == 0


def _rows(path: Path) -> Iterable[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        yield from csv.DictReader(f)


def load(directory: str | Path) -> list[Sweep]:
    """Every configuration of the three sweep files in ``directory``, sorted by key. Raises OSError when a
    file is missing, ValueError for a row that is not numbers."""
    raw: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for gpu, name in FILES.items():
        for row in _rows(Path(directory) / name):
            key = "/".join((gpu, row["dataset"], row["network"], row["batch_size"], row["optimizer"]))
            raw.setdefault((gpu, key), []).append(
                (float(row["power_limit"]), float(row["time_per_epoch"]), float(row["average_power"])))
    sweeps = []
    for (gpu, key), points in sorted(raw.items(), key=lambda kv: kv[0][1]):
        points.sort()
        top_draw = points[-1][2]
        ref = [p for p in points if p[0] >= UNBOUND_RATIO * top_draw] or [points[-1]]
        t_ref = statistics.median(p[1] for p in ref)
        p_ref = statistics.median(p[2] for p in ref)
        sweeps.append(Sweep(key=key, gpu=gpu, draw_w=p_ref, max_limit_w=points[-1][0],
                            limits_w=tuple(p[0] for p in points),
                            x=tuple(p[0] / p_ref for p in points), u=tuple(p[2] / p_ref for p in points),
                            r=tuple(t_ref / p[1] for p in points)))
    return sweeps


def best_1d(f: Callable[[float], float], lo: float, hi: float, *, grid: int = 200,
            tol: float = 1e-6) -> float:
    """The ``v`` in [lo, hi] that minimizes ``f``: the best of ``grid`` + 1 evenly spaced points, refined by
    golden-section search between its neighbours (the per-job losses are sums of absolute errors, with
    kinks and sometimes several dips: a grid first finds the deepest). Deterministic; ties go low."""
    step = (hi - lo) / grid
    values = [f(lo + i * step) for i in range(grid + 1)]
    k = min(range(grid + 1), key=lambda i: (values[i], i))
    a, b = max(lo, lo + (k - 1) * step), min(hi, lo + (k + 1) * step)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best = (a + b) / 2.0
    return best if f(best) <= values[k] else lo + k * step


def interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Linear interpolation of ``ys`` over ascending ``xs`` at ``x`` (flat beyond the ends)."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + f * (ys[i] - ys[i - 1])
    return ys[-1]


def measured_at(sweeps: Iterable[Sweep], x: float) -> dict[str, float]:
    """Across configurations that were swept down to ``x``: median slowdown, its p90, and the median gain
    in work per joule of a cap at ``x`` × the job's own draw (interpolated between the swept limits).
    The measured answer the calibrated law is checked against."""
    slow, gain = [], []
    for s in sweeps:
        if s.x[0] > x:
            continue
        r, u = interp(s.x, s.r, x), interp(s.x, s.u, x)
        slow.append(1.0 - r)
        gain.append(r / u - 1.0)
    slow.sort()
    return {"n": len(slow), "slowdown_median": statistics.median(slow),
            "slowdown_p90": slow[min(len(slow) - 1, int(0.9 * len(slow)))],
            "gain_median": statistics.median(gain)}
