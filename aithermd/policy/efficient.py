"""The efficient-limit search: a per-GPU power limit found inside each sustained load phase. Pure.

``{kind: gpu_power_limit, when: {state: load.busy}, limit: efficient, max_slowdown_pct: 3}``. While the
rule holds for a GPU, :func:`step` walks this sequence, one measurement window (``measure_s``) per step,
the first seconds after each change left out (:data:`SETTLE_S`):

1. **baseline** at the card's default limit: the job's own draw (mean power), its peak (:meth:`Acc.held_peak`:
   the highest 1 s reading another comes within 5 % of, not over that limit) and its throughput signal (two
   windows; one for a progress rate, read per busy second below);
2. **snap** to the job's own peak draw (a cap 1.1 × a job's mean draw costs ~0.5 %: the Zeus sweeps),
   kept if the signal holds; else once halfway back up, settled there if that holds (else the default).
   A progress rate **jumps** instead to where the Zeus sweeps' median job loses :data:`JUMP_USE` of the
   budget (1.05 × the own draw at 3 %, 1.0 × at 5 %);
3. **step down** ``step_pct`` of the own draw at a time (:data:`ABOVE_OWN` times that while the next limit
   stays above the own draw, where a cap only trims the job's bursts) while the signal keeps
   ≥ (1 − budget) of the baseline's and work per joule (signal / power) does not fall; a progress rate
   steps toward the budget's edge its last window predicts (its loss scales the Zeus sweeps' median
   curve: :func:`~aithermd.policy.search_window.edge_cap`; 1 to :data:`MAX_JUMP` steps). A miss needs the
   shortfall to exceed :data:`MISS_Z_POWER` standard errors of the two windows' ratio (a progress rate:
   one, from block means; a clock search: half), or work per joule to fall by more than 5 %; at the first
   miss **back off** — a power search to where the line through the last kept window and the miss crosses
   the budget, else one step;
4. **settled** at the last good limit, watching for a new phase over two windows at a time: the cap
   stops binding (the job got lighter) or the signal moves by more than 6 % or twice the budget (a
   different job or phase) — then it searches again from the baseline.

It **reverts** to the default limit at once, and waits ``measure_s`` before searching again, on a thermal
event (the driver's thermal slowdown in the clock-event reasons), when its signal cannot be read, or when
the job ended. A window the job was away (ended, paused: :meth:`Acc.away`) is measured again at that limit.

A progress rate steps down only on readings it can trust: a window with a stall in it (a 20 s block
under 3/4 of its median: :meth:`Acc.stalled`) is measured again (a baseline always, a step twice); a rate
too noisy to resolve the budget (:data:`RESOLVE`) is measured longer, up to :data:`MAX_WINDOWS` windows,
then a baseline gives way to the next signal (else stays at the default) and a step counts as a miss;
a step reading more than 6 % (or twice the budget) above its baseline restarts the search.

The same search runs on the top of a locked SM clock range (``kind: gpu_clocks``, ``max_mhz:
efficient``, ``clocks``): unlocked first, then down ``step_pct`` of the top clock per window, no snap. It is
the lever for memory-bound work such as LLM decode, which draws far below any power limit (so no cap
binds) while a lower SM clock costs it little: its signals are the job's progress rate, else memory
utilization (the bandwidth a memory-bound job turns into work; utilization × clock reads the lock itself).

Throughput signal, best first (:data:`SIGNALS`): the job's own progress rate (``gpu<N>/progress_rate``, steps
per second from ``aithermctl run --progress-regex``; a power search reads it per busy second, over the
window's mean utilization against the baseline's, so that the job's own loader stalls, which differ from one
window to the next and are the same at any limit, do not read as the cap's cost: :func:`_ratio`), GPM tensor
activity × SM clock (Hopper and newer), utilization × SM clock. The cheap proxy overstates the slowdown of
memory-bound jobs (the clock falls further than the work): it is read through the job's memory-bound share
(:func:`proxy_ratio`), measured in the baseline as memory utilization over utilization: :data:`MEM_TRUST`
of it, up to all of it where the window's memory utilization confirms it (:func:`_ratio`). A proxy's
window error comes from block means (:meth:`~aithermd.policy.search_window.Acc.spread`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aithermd.model import Reading
from aithermd.policy.search_window import Acc, edge_cap, explain_text, proxy_ratio, read_signal, zeus_cap
from aithermd.policy.search_window import value_of as _ok

SETTLE_S = 3.0  # seconds after a limit change left out of the measurement (the driver and the job adjust)
EFF_TOLERANCE = 0.05  # a step whose work per joule falls more than this share below the best is a miss
LIGHTER = 0.7  # settled: mean power under this share of the limit, or of the job's own draw when the limit
#                sits above it, = the job got lighter (a cap at the own draw leaves ~0.89 of it drawn: the
#                Zeus sweeps; a limit above the own draw leaves the own draw)
PHASE_MOVE = 0.06  # settled: the signal moving this far (or 2 × the budget) from where it settled = new phase
WATCH_WINDOWS = 2  # windows the baseline and the settled watch read at once (loader stalls move one by ±2 %;
#                   a progress rate per busy second leaves them out and its baseline reads one)
HISTORY = 12  # steps kept for explain
MISS_Z = 0.5  # a step misses when its throughput falls short of the budget by this many standard errors
MISS_Z_PROGRESS = 1.0  # … of a progress rate read per busy second (its error from block means: rate_spread)
MISS_Z_POWER = 0.9  # … of a power search's GPM or proxy signal (MISS_Z: a clock search's): the budget used
AWAY_SHARE = 0.15  # a window with over 15 % of its seconds away (search_window.AWAY: under 40 % of its own
#                    running draw) saw the job away (ended, paused): no verdict, measured again
AWAY_REDOS = 2  # … at most twice in a row: a job that is always half away (bursty) is judged as it is
ABOVE_OWN = 2.0  # steps this many times longer while they stay above the job's own draw (cheap there)
JUMP_USE = 0.5  # a progress search jumps first to where the Zeus median job loses this share of budget
MAX_JUMP = 3.0  # … then toward the budget's edge each kept window predicts: 1 to this many steps
RESOLVE = 0.5  # a progress verdict needs its allowed error (MISS_Z_PROGRESS SEs of a step) within this share
#                of the budget, else the window is measured longer (at most MAX_WINDOWS): a rate too noisy
#                for that cannot tell a miss, so a baseline gives way to the next signal and a step is a miss
MAX_WINDOWS = 4
ENDED_S = 15.0  # settled: a window whose last this many seconds averaged under IDLE_UTIL_PCT saw the job end
MEM_TRUST = 0.5  # the proxy's correction counts this share of the memory-busy share it measured (below)
MEM_MAX = 0.8  # … and never more than this
IDLE_UTIL_PCT = 10.0  # a signal lost with utilization under this: the job ended (the shipped idle bound)
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown")
SIGNALS = ("progress", "gpm", "proxy")
CLOCK_SIGNALS = ("progress", "memory")  # a clock search sets the clock: utilization × clock says nothing
BASELINE, SNAP, STEP, SETTLED, REVERTED = "baseline", "snap", "step", "settled", "reverted"


@dataclass(frozen=True, slots=True)
class Spec:
    """The rule's tuning: ``budget`` (max slowdown, a share), ``step`` (share of the own draw per step;
    of the top clock for ``clocks``), ``measure_s`` (one window), ``floor`` (lowest limit, share of the own
    draw; of the top clock for ``clocks``), ``signal`` (``auto`` or one of :data:`SIGNALS`)."""

    budget: float = 0.03
    step: float = 0.04
    measure_s: float = 60.0
    floor: float = 0.6
    signal: str = "auto"
    clocks: bool = False  # searching the top of a locked SM clock range (MHz) instead of a power limit


CLOCK_SPEC = Spec(budget=0.02, step=0.05, measure_s=60.0, floor=0.1, clocks=True)  # gpu_clocks defaults


@dataclass(frozen=True, slots=True)
class Search:
    """One GPU's search. ``limit`` (W) is what it asks for now; ``start`` the default limit it returns
    to; ``own``/``peak`` the job's own mean and peak draw (W) from the baseline; ``base``/``base_eff`` the
    baseline signal and signal per watt; ``best``/``best_eff``/``best_ratio`` the last accepted limit and
    what it measured; ``history`` (limit W, signal ratio, work/J gain, verdict) per finished window."""

    phase: str
    limit: float
    start: float
    signal: str
    acc: Acc
    own: float = 0.0
    peak: float = 0.0
    base: float = 0.0
    base_eff: float = 0.0
    base_se: float = 0.0  # the baseline's relative standard error (Acc.spread)
    best: float = 0.0
    best_eff: float = 0.0
    best_ratio: float = 1.0
    steps: int = 0
    backoffs: int = 0
    redos: int = 0  # windows measured again in a row because the job was away
    ext: int = 0  # progress only: windows the current one was extended by, its rate too noisy (RESOLVE)
    mem: float = 0.0  # proxy only: the memory-bound share its ratios are corrected for (proxy_ratio)
    mem_top: float = 0.0  # proxy only: the whole share measured (the most the memory traffic may confirm)
    base_mem: float = 0.0  # proxy only: the baseline's mean memory utilization (%)
    base_util: float = 0.0  # progress only, not for clocks: the baseline's mean utilization (%) (_ratio)
    mem_sums: tuple[float, float, int] = (0.0, 0.0, 0)  # this window's memory utilization, utilization, n
    history: tuple[tuple[float, float, float, str], ...] = ()
    why: str = ""


def pick_signal(spec: Spec, gpu: str, readings: Mapping[str, Reading]) -> str | None:
    """The best signal readable now (or the one the rule names, if readable)."""
    kinds = (CLOCK_SIGNALS if spec.clocks else SIGNALS) if spec.signal == "auto" else (spec.signal,)
    return next((k for k in kinds if read_signal(k, gpu, readings) is not None), None)


def _window(t: float) -> Acc:
    return Acc(t + SETTLE_S)


def start(spec: Spec, gpu: str, t: float, default_w: float,
          readings: Mapping[str, Reading]) -> Search | None:
    """A new search at the default limit (for ``clocks``, the top clock: unlocked), or None when no signal
    can be read."""
    signal = pick_signal(spec, gpu, readings)
    if signal is None:
        return None
    return Search(BASELINE, default_w, default_w, signal, _window(t),
                  why="measuring the job " + ("unlocked" if spec.clocks else "at the default"))


def _revert(s: Search, t: float, why: str) -> Search:
    return replace(s, phase=REVERTED, limit=s.start, acc=_window(t), why=why,
                   history=(s.history + ((s.start, 1.0, 0.0, "revert"),))[-HISTORY:])


def _lost(signal: str, power: float | None, util: float | None) -> str:
    """Why a search went back to the default when its signal or the power stopped reading: the job ended
    (the GPU idle: its load phase is over), the power, or the signal unreadable while the GPU works."""
    if power is not None and util is not None and util < IDLE_UTIL_PCT:
        return f"the job ended (no {signal} signal, the GPU idle at {util:.0f} %): back to the default limit"
    what = "power" if power is None else f"{signal} signal" + (" (the job stopped reporting its progress)"
                                                               if signal == "progress" else "")
    return f"{what} unreadable while the GPU works: back to the default limit"


def _move(s: Search, t: float, phase: str, limit: float, why: str, **kw: Any) -> Search:
    return replace(s, phase=phase, limit=limit, acc=_window(t), why=why, mem_sums=(0.0, 0.0, 0), ext=0, **kw)


def _noisy(spec: Spec, s: Search, gpu: str, t: float, readings: Mapping[str, Reading], se: float) -> Search:
    """A progress baseline whose rate is too noisy to resolve the budget (:data:`RESOLVE`): measured one
    window longer, at most :data:`MAX_WINDOWS`; then the next readable signal (``auto``), else the default."""
    noise = f"the progress rate ±{100 * se:.1f} % over {s.ext + 1} window(s): too noisy for the " \
            f"{100 * spec.budget:g} % budget"
    if s.ext + 1 < MAX_WINDOWS:
        return replace(s, ext=s.ext + 1, why=f"{noise}, measuring longer")
    nxt = next((k for k in SIGNALS[1:] if read_signal(k, gpu, readings) is not None), None)
    if spec.signal != "auto" or nxt is None:
        return _move(s, t, BASELINE, s.start, f"{noise}: staying at the default, measuring again")
    return _move(s, t, BASELINE, s.start, f"{noise}: searching on the {nxt} signal instead", signal=nxt)


def step(spec: Spec, s: Search, gpu: str, t: float, readings: Mapping[str, Reading],
         attrs: Mapping[str, Any], lo_w: float | None, applied_w: float | None = None) -> Search:
    """Advance ``s`` by one tick at ``t``. ``attrs``: the GPU's per-tick attributes (clock-event reasons);
    ``lo_w`` the knob's own minimum (W); ``applied_w`` the limit read back from the card (None: unknown).
    While the card is not at the limit the search asked for (not applied yet, or an override, a hold or
    the safety layer holds it elsewhere) nothing is measured."""
    reasons = attrs.get("clock_event_reasons") or ()
    if s.phase != REVERTED and any(r in reasons for r in THERMAL_REASONS):
        return _revert(s, t, "thermal slowdown: back to the default limit")
    if applied_w is not None and abs(applied_w - s.limit) > 1.0:
        return replace(s, acc=_window(t), mem_sums=(0.0, 0.0, 0))
    value, power = read_signal(s.signal, gpu, readings), _ok(readings.get(f"{gpu}/power"))
    if value is None or power is None:
        if s.phase == REVERTED:
            return s
        return _revert(s, t, _lost(s.signal, power, _ok(readings.get(f"{gpu}/utilization"))))
    mem, util = _ok(readings.get(f"{gpu}/memory_utilization")), _ok(readings.get(f"{gpu}/utilization"))
    acc = s.acc.add(t, value, power, 100.0 if util is None else util)
    s = replace(s, acc=acc)
    if t >= acc.t0:
        if util is not None and (mem is not None or s.signal != "proxy"):
            m, u, n = s.mem_sums
            s = replace(s, mem_sums=(m + (mem or 0.0), u + util, n + 1))
    rate = s.signal == "progress" and not spec.clocks  # read per busy second (_ratio), its error by blocks
    windows = WATCH_WINDOWS if s.phase == SETTLED or (s.phase == BASELINE and not rate) else 1
    window = spec.measure_s * (windows + s.ext)
    if acc.span < window - 1e-9:
        return s
    trim = s.signal != "progress"
    sig, pw = acc.mean(trim)
    if s.phase != REVERTED and s.redos < AWAY_REDOS and acc.away() > AWAY_SHARE:
        away = round(100 * acc.away())
        return replace(s, acc=_window(t - SETTLE_S), redos=s.redos + 1, mem_sums=(0.0, 0.0, 0),
                       why=f"the job was away {away} % of the window (ended or paused): no verdict, "
                       "measuring again")
    if rate and (s.phase == BASELINE or s.phase == STEP and s.redos < AWAY_REDOS) and acc.stalled():
        # a baseline is never trusted with a stall: every later window would read against a wrong base
        return replace(s, acc=_window(t - SETTLE_S), redos=s.redos + 1, ext=0, mem_sums=(0.0, 0.0, 0),
                       why="the job stalled (its progress stopped for seconds while the GPU kept busy): no "
                       "verdict, measuring again")
    s = replace(s, redos=0)
    if s.phase == REVERTED:
        return _move(s, t, BASELINE, s.start, "measuring the job at the default again")
    if s.phase == BASELINE:
        if sig <= 0 or pw <= 0:
            return _move(s, t, BASELINE, s.start, "no work to measure yet")
        err = MISS_Z_PROGRESS * acc.rate_spread() * math.sqrt(2.0) if rate else 0.0  # a step's, alike
        if err > RESOLVE * spec.budget:
            return _noisy(spec, s, gpu, t, readings, err / math.sqrt(2.0))
        peak = math.ceil(acc.held_peak(s.limit))  # one reading is no peak; never over the limit in force
        mem_sum, util_sum, n = s.mem_sums
        top = min(MEM_MAX, mem_sum / util_sum) if util_sum > 0 and s.signal == "proxy" else 0.0
        s = replace(s, own=pw, peak=peak, base=sig, base_eff=sig / pw, best=s.start, best_eff=sig / pw,
                    base_se=_spread(acc, trim, rate), history=((s.start, 1.0, 0.0, "baseline"),),
                    mem=MEM_TRUST * top, mem_top=top, base_mem=mem_sum / n if n else 0.0,
                    base_util=util_sum / n if n and s.signal == "progress" and not spec.clocks else 0.0)
        if rate:
            return _jump(spec, s, t, lo_w)
        target = max(peak, lo_w or 0.0)
        if spec.clocks or target >= 0.98 * s.start:  # a clock has no "peak draw" to snap to
            return _step_down(spec, s, t)
        return _move(s, t, SNAP, target, f"snap to the job's peak draw {peak:g} W", steps=1)
    ratio = _ratio(s, sig)
    eff = ratio * s.base / pw if pw > 0 else 0.0
    gain = eff / s.base_eff - 1.0 if s.base_eff > 0 else 0.0
    if s.phase in (SNAP, STEP):
        # a miss needs evidence: the shortfall must exceed MISS_Z standard errors of the two windows' ratio
        z = MISS_Z_PROGRESS if rate else MISS_Z if spec.clocks else MISS_Z_POWER
        se = z * ratio * (_spread(acc, trim, rate) ** 2 + s.base_se ** 2) ** 0.5
        noisy = rate and se > RESOLVE * spec.budget
        if noisy and s.ext + 1 < MAX_WINDOWS:
            return replace(s, ext=s.ext + 1, why=f"the progress rate ±{100 * se:.1f} % at {s.limit:g} W: "
                           f"too noisy for the {100 * spec.budget:g} % budget, measuring longer")
        if ratio > 1.0 + max(PHASE_MOVE, 2.0 * spec.budget) and not noisy:  # no cap makes a job this fast
            return _restart(s, t, f"throughput {100 * ratio:.1f} % of the baseline under a lower limit: the "
                            "baseline was not this job's (or its phase changed): measuring again")
        kept_eff = s.phase == SNAP or eff >= s.best_eff * (1.0 - EFF_TOLERANCE)
        good = ratio + se >= 1.0 - spec.budget and kept_eff and not noisy
        entry = (s.limit, round(ratio, 4), round(gain, 4), "keep" if good else "miss")
        s = replace(s, history=(s.history + (entry,))[-HISTORY:])
        if good:
            s = replace(s, best=s.limit, best_eff=max(eff, s.best_eff), best_ratio=ratio)
            if s.backoffs:  # after its one back-off a search goes no lower
                return _move(s, t, SETTLED, s.best, f"settled at {s.best:g} W, halfway back up from the peak")
            return _predict(spec, s, t, ratio, se / z) if rate else _step_down(spec, s, t)
        far = s.best - s.limit > 2.0 * spec.step * s.own
        if s.phase == SNAP and not spec.clocks and s.steps == 1 and far:
            # the peak a 1 s reading shows was not free (a job that bursts within the second): try once
            # halfway back up — the search's one back-off — and settle there if it holds
            mid = round((s.best + s.limit) / 2.0, 1)
            return _move(s, t, SNAP, mid, f"{_miss(ratio, eff, s, spec)} at {s.limit:g} W: try {mid:g} W",
                         steps=2, backoffs=s.backoffs + 1)
        unit = "MHz" if spec.clocks else "W"
        target = 1.0 - spec.budget
        if noisy:  # a step it cannot tell from the noise counts as a miss: a wrong keep costs the whole job
            return _move(s, t, SETTLED, s.best, f"back off to {s.best:g} W: the progress rate (±"
                         f"{100 * se:.1f} %) cannot tell {100 * ratio:.1f} % at {s.limit:g} W from a miss",
                         backoffs=s.backoffs + 1)
        if not spec.clocks and s.phase == STEP and ratio < target < s.best_ratio:
            # settle where the line through the last kept window and the miss crosses the budget (not a
            # whole step back: the proxies then used 2.5 % of 3 %). A cap's cost grows faster the
            # deeper it goes (the law's knee), so that line runs under the job's curve: the limit it gives
            # keeps the budget or more
            mid = round(s.limit + (s.best - s.limit) * (target - ratio) / (s.best_ratio - ratio), 1)
            return _move(s, t, SETTLED, mid, f"back off to {mid:g} W, where {100 * s.best_ratio:.1f} % at "
                         f"{s.best:g} W and {_miss(ratio, eff, s, spec)} at {s.limit:g} W cross the budget",
                         best=mid, best_ratio=target, backoffs=s.backoffs + 1)
        return _move(s, t, SETTLED, s.best, f"back off to {s.best:g} {unit}: {_miss(ratio, eff, s, spec)}",
                     backoffs=s.backoffs + 1)
    # settled: watch for a new phase (a job that stopped reads as one: said as such)
    recent = acc.recent_util(ENDED_S)
    ended = recent is not None and recent < IDLE_UTIL_PCT
    why = (f"the job ended or paused (the GPU idle at {recent:.0f} % over the last {ENDED_S:g} s): back to "
           "the default limit, measuring again" if ended else "")
    if not spec.clocks and s.limit < s.start and pw < LIGHTER * min(s.limit, s.own or s.limit):
        return _restart(s, t, why or f"the job got lighter ({pw:.0f} W, its own draw {s.own:.0f} W, under a "
                        f"{s.limit:g} W limit): search again")
    if abs(ratio - s.best_ratio) > max(PHASE_MOVE, 2.0 * spec.budget):
        return _restart(s, t, why or f"throughput moved to {100 * ratio:.1f} % of the baseline: search again")
    return replace(s, acc=_window(t - SETTLE_S), mem_sums=(0.0, 0.0, 0))


def _spread(acc: Acc, trim: bool, rate: bool) -> float:
    """A window's relative standard error: of the progress rate per busy second by blocks, else Acc.spread."""
    return acc.rate_spread() if rate else acc.spread(trim)


def _ratio(s: Search, sig: float) -> float:
    """The window's throughput against the baseline's. The proxy is read through the memory-bound share
    counted at MEM_TRUST, or up to the whole share measured where the window's memory traffic confirms it:
    a job's memory traffic per unit of work is fixed, so its memory utilization falls with its throughput,
    and a memory-stalled job keeps its traffic while its SM clock falls (the whole share is the most it can
    hide, since overlap makes memory busy time exceed the stalls); an overlapped, compute-bound job's
    traffic falls with the clock, and the counted share stands."""
    if s.base <= 0:
        return 0.0
    m, u, n = s.mem_sums
    if n and u > 0 and s.base_util > 0:
        sig *= s.base_util / (u / n)  # progress per busy second: the job's own stalls left out
    ratio = proxy_ratio(sig / s.base, s.mem)
    if s.mem_top > s.mem and s.base_mem > 0 and n:
        ratio = max(ratio, min(proxy_ratio(sig / s.base, s.mem_top), m / n / s.base_mem))
    return ratio


def _miss(ratio: float, eff: float, s: Search, spec: Spec) -> str:
    if ratio < 1.0 - spec.budget:
        return f"throughput {100 * ratio:.1f} % < {100 * (1 - spec.budget):.1f} % of the baseline"
    return "work per joule stopped improving"


def _step_down(spec: Spec, s: Search, t: float) -> Search:
    scale = s.start if spec.clocks else s.own
    unit = "MHz" if spec.clocks else "W"
    size = spec.step * scale
    if not spec.clocks and s.best - ABOVE_OWN * size >= s.own > 0:
        size *= ABOVE_OWN  # above the own draw a cap trims only the job's bursts (Zeus sweeps: ~1 % at 1.1)
    nxt = round(s.best - size, 0 if spec.clocks else 1)
    floor = spec.floor * scale
    if nxt < floor:
        why = f"settled at {s.best:g} {unit}: the floor {floor:.0f} {unit} is next"
        return _move(s, t, SETTLED, s.best, why)
    return _move(s, t, STEP, nxt, f"step down to {nxt:g} {unit}", steps=s.steps + 1)


def _jump(spec: Spec, s: Search, t: float, lo_w: float | None) -> Search:
    """A progress search's first step: where the Zeus median job loses :data:`JUMP_USE` of the budget."""
    x = zeus_cap(JUMP_USE * -math.log(1.0 - spec.budget))
    nxt = round(max(x * s.own, lo_w or 0.0, spec.floor * s.own), 1)
    if nxt >= 0.98 * s.start:
        return _predict(spec, s, t, 1.0, 0.0)
    return _move(s, t, STEP, nxt, f"jump to {nxt:g} W ({100 * x:.0f} % of the job's own draw {s.own:.0f} W), "
                 f"where the Zeus sweeps' median job loses {100 * JUMP_USE * spec.budget:.1f} %", steps=1)


def _predict(spec: Spec, s: Search, t: float, ratio: float, err: float) -> Search:
    """A progress search's next step: toward the budget's edge its kept window predicts (``edge_cap`` of
    ``ratio`` less one standard error ``err``), 1 to :data:`MAX_JUMP` steps."""
    own, unit = s.own, spec.step * s.own
    edge = edge_cap(ratio - err, s.best / own, spec.budget) * own
    nxt = round(s.best - min(max(s.best - edge, unit), MAX_JUMP * unit), 1)
    floor = spec.floor * own
    if nxt < floor:
        return _move(s, t, SETTLED, s.best, f"settled at {s.best:g} W: the floor {floor:.0f} W is next")
    why = f"step down to {nxt:g} W: {100 * ratio:.1f} % at {s.best:g} W puts the budget's edge near {edge:.0f} W"
    if nxt < edge:  # the edge is within one step: the smallest step goes past it, to be measured there
        why += f", less than one step ({unit:.1f} W) lower: one step to measure"
    return _move(s, t, STEP, nxt, why, steps=s.steps + 1)


def _restart(s: Search, t: float, why: str) -> Search:
    return replace(s, phase=BASELINE, limit=s.start, acc=_window(t), why=why, steps=0, backoffs=0,
                   mem_sums=(0.0, 0.0, 0),
                   history=(s.history + ((s.start, 1.0, 0.0, "new phase"),))[-HISTORY:])


def explain(s: Search, spec: Spec) -> tuple[str, dict[str, Any]]:
    """The reason text and the inputs of the decision this search makes now (a fresh dict each call)."""
    text, inputs = explain_text(spec.clocks, spec.budget, s.phase, s.signal, s.why, s.history, s.own, s.peak,
                                s.best_ratio, s.best_eff, s.base_eff)
    return text, dict(inputs)
