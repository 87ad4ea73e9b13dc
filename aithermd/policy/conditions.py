"""Conditions compiled for one machine: metric windows, all/any/not, schedules, processes, states.

Three-valued: a condition is True, False or None (unknown: a failed sensor, a window not yet full). None
never triggers anything: ``all`` is None unless some part is False, ``any`` is None unless some part is True,
``not None`` is None. ``sustain_s`` needs the condition True continuously that long (the start time is kept in
:attr:`Ctx.held_new`, the next tick's ``held``).

Besides each metric's statistic, a condition notes in :attr:`Ctx.stats` (which become the decision's
Explain inputs) how far its time is along, as ``{"elapsed_s", "need_s"}`` (s): ``"<metric> < X"`` (or
``>= X``) for a window that every sample must meet (``max`` … ``below``, ``min`` … ``above``: how long they
all have, of ``window_s``), ``"<metric> history"`` for any other window while its history is shorter than
``window_s``, and ``"<condition> sustained"`` for a ``sustain_s`` timer while its condition holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any

from aithermd.model import Device
from aithermd.policy import selectors
from aithermd.policy.references import resolve_state
from aithermd.policy.schedules import Calendar, Period, compile_periods, holds
from aithermd.policy.kinds import (
    AllCondition,
    AnyCondition,
    MetricCondition,
    NotCondition,
    PolicyDocument,
    ProcessCondition,
    ScheduleCondition,
    StateCondition,
)
from aithermd.policy.windows import Window

GPU_ATTR = MappingProxyType({
    "gpu.utilization_pct": "utilization", "gpu.memory_utilization_pct": "memory_utilization",
    "gpu.power_w": "power", "gpu.power_pct": "power_pct", "gpu.temperature_c": "temperature",
    "gpu.memory_temperature_c": "memory_temperature", "gpu.held_idle_w": "held_idle_w",
})
CPU_KEY = MappingProxyType({"cpu.utilization_pct": "cpu/utilization", "cpu.power_w": "cpu/package_power"})


@dataclass(slots=True)
class Ctx:
    """Per-tick scratch for evaluating conditions (not engine state)."""

    now: float
    t_wall: float
    windows: Mapping[str, Window]
    ok: frozenset[str] | set[str]  # window keys with a fresh, ok value this tick
    processes: frozenset[str] = frozenset()
    machine_states: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict)
    held: Mapping[str, float] = field(default_factory=dict)
    held_new: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    scope: str | None = None  # a GPU id, or None machine-wide
    searches: Mapping[str, Any] = field(default_factory=dict)  # efficient-limit searches, last tick's
    searches_new: dict[str, Any] = field(default_factory=dict)  # and this tick's (the next tick's input)


class Node:
    """``timed``: this node or one below it keeps a ``sustain_s`` timer, so it must be evaluated every tick
    (no short-circuit may skip it)."""

    __slots__ = ("key", "sustain_s", "timed")

    def __init__(self, key: str, sustain_s: float, below: Sequence[Node] = ()) -> None:
        self.key, self.sustain_s = key, sustain_s
        self.timed = sustain_s > 0 or any(n.timed for n in below)

    def test(self, ctx: Ctx) -> bool | None:
        raise NotImplementedError

    def eval(self, ctx: Ctx) -> bool | None:
        result = self.test(ctx)
        if self.sustain_s <= 0:
            return result
        if result is not True:
            return result
        k = f"{self.key}@{ctx.scope}"
        since = ctx.held.get(k, ctx.now)
        ctx.held_new[k] = since
        ctx.stats[f"{self.name} sustained"] = progress(ctx.now - since, self.sustain_s)
        return ctx.now - since >= self.sustain_s - 1e-9

    @property
    def name(self) -> str:
        """How Explain names this condition: its place in the policy (``rules[1].when``)."""
        return self.key


def progress(elapsed_s: float, need_s: float) -> dict[str, float]:
    """``{"elapsed_s", "need_s"}``: time along (at most ``need_s``), of the time needed (s)."""
    return {"elapsed_s": round(min(max(0.0, elapsed_s), need_s), 3), "need_s": need_s}


class Metric(Node):
    __slots__ = ("metric", "attr", "keys", "stat", "window_s", "above", "below", "label")

    def __init__(self, key: str, c: MetricCondition, keys: Sequence[str]) -> None:
        super().__init__(key, c.sustain_s)
        self.metric, self.stat, self.window_s = c.metric, c.stat, c.window_s
        self.above, self.below = c.above, c.below
        self.attr = GPU_ATTR.get(c.metric)
        self.keys = tuple(keys)  # machine-wide keys (all GPUs / the sensors / the cpu key)
        w = "" if c.stat == "last" else f"_{c.window_s:g}s"
        self.label = f"{c.metric}{'[' + ','.join(c.sensor) + ']' if c.sensor else ''}.{c.stat}{w}"

    def value(self, ctx: Ctx) -> tuple[float | None, bool]:
        """(statistic, complete): the max over the keys in scope; complete False when some key is unknown."""
        keys = (f"{ctx.scope}/{self.attr}",) if self.attr and ctx.scope else self.keys
        best, complete = None, True
        for k in keys:
            w = ctx.windows.get(k)
            v = w.stat(self.stat, self.window_s, ctx.now) if w is not None and k in ctx.ok else None
            if v is None:
                complete = False
            elif best is None or v > best:
                best = v
        return best, complete and bool(keys)

    @property
    def name(self) -> str:
        return self.label

    @property
    def whole_name(self) -> str:
        """``gpu.utilization_pct.max_90s < 10``: what every sample of the window must meet."""
        if self.below is not None:
            return f"{self.label} < {self.below:g}"
        return f"{self.label} >= {self.above:g}"

    def test(self, ctx: Ctx) -> bool | None:
        v, complete = self.value(ctx)
        ctx.stats[self.label] = v
        if self.above is not None:
            result = True if v is not None and v >= self.above else False if complete else None
        elif not complete or v is None:
            result = None
        else:
            result = v < self.below  # type: ignore[operator]
        if self.stat != "last":
            self._progress(ctx, result)
        return result

    def _progress(self, ctx: Ctx, result: bool | None) -> None:
        """Note how far this window is along (see the module docstring); a window that every sample must
        meet walks back only over the samples that met it."""
        whole = (self.stat == "max" and self.below is not None) or \
            (self.stat == "min" and self.above is not None)
        if not whole and result is not None:  # the usual tick: a full window that decided, nothing to note
            return
        keys = (f"{ctx.scope}/{self.attr}",) if self.attr and ctx.scope else self.keys
        windows = [ctx.windows.get(k) if k in ctx.ok else None for k in keys]
        if whole:
            if result is True:
                elapsed = self.window_s
            else:
                below, above = self.below, self.above
                ok = (lambda x: x < below) if below is not None else (lambda x: x >= above)  # type: ignore[operator]
                elapsed = min((w.held_s(ok, self.window_s, ctx.now) if w is not None else 0.0
                               for w in windows), default=0.0)
            ctx.stats[self.whole_name] = progress(elapsed, self.window_s)
        elif result is None:
            covered = min((w.held_s(lambda x: True, self.window_s, ctx.now) if w is not None else 0.0
                           for w in windows), default=0.0)
            if covered < self.window_s:
                ctx.stats[f"{self.label} history"] = progress(covered, self.window_s)


class All(Node):
    __slots__ = ("parts",)

    def __init__(self, key: str, sustain_s: float, parts: list[Node]) -> None:
        super().__init__(key, sustain_s, parts)
        self.parts = parts

    def test(self, ctx: Ctx) -> bool | None:
        result: bool | None = True
        for p in self.parts:
            r = p.eval(ctx)
            if r is False:
                result = False
                if not self.timed:
                    return result
            elif r is None and result is True:
                result = None
        return result


class AnyOf(All):
    __slots__ = ()

    def test(self, ctx: Ctx) -> bool | None:
        result: bool | None = False
        for p in self.parts:
            r = p.eval(ctx)
            if r is True:
                result = True
                if not self.timed:
                    return result
            elif r is None and result is False:
                result = None
        return result


class Not(Node):
    __slots__ = ("inner",)

    def __init__(self, key: str, sustain_s: float, inner: Node) -> None:
        super().__init__(key, sustain_s, (inner,))
        self.inner = inner

    def test(self, ctx: Ctx) -> bool | None:
        r = self.inner.eval(ctx)
        return None if r is None else not r


class Schedule(Node):
    __slots__ = ("periods", "calendar")

    def __init__(self, key: str, c: ScheduleCondition, periods: tuple[Period, ...] | None = None,
                 calendar: Calendar | None = None) -> None:
        """``periods``: the windows (default: the condition's inline ones); ``calendar``: the policy's time
        zone and holidays (default: local time, no holidays)."""
        super().__init__(key, c.sustain_s)
        if periods is None:
            spec = c.schedule
            periods = compile_periods(spec if isinstance(spec, list) else [spec]) if not isinstance(spec, str) \
                else ()
        self.periods, self.calendar = periods, calendar or Calendar()

    def test(self, ctx: Ctx) -> bool | None:
        return holds(self.periods, self.calendar, ctx.t_wall)


class Process(Node):
    __slots__ = ("patterns",)

    def __init__(self, key: str, c: ProcessCondition) -> None:
        super().__init__(key, c.sustain_s)
        self.patterns = tuple(c.process)

    def test(self, ctx: Ctx) -> bool | None:
        hit = any(fnmatchcase(p, pat) for p in ctx.processes for pat in self.patterns)
        ctx.stats[f"process[{','.join(self.patterns)}]"] = hit
        return hit


class InState(Node):
    __slots__ = ("machine", "state", "per_gpu")

    def __init__(self, key: str, c: StateCondition, machine: str, state: str, per_gpu: bool) -> None:
        super().__init__(key, c.sustain_s)
        self.machine, self.state, self.per_gpu = machine, state, per_gpu

    def test(self, ctx: Ctx) -> bool | None:
        if not self.per_gpu:
            cur = ctx.machine_states.get((self.machine, "machine"))
            return cur is not None and cur[1] and cur[0] == self.state
        if ctx.scope is not None and (self.machine, ctx.scope) in ctx.machine_states:
            name, settled = ctx.machine_states[(self.machine, ctx.scope)]
            return settled and name == self.state
        return any(settled and name == self.state
                   for (m, _s), (name, settled) in ctx.machine_states.items() if m == self.machine)


@dataclass
class Compiler:
    """Builds :class:`Node` trees for one policy on one machine; collects the windows they need."""

    doc: PolicyDocument
    devices: Sequence[Device]
    needs: dict[str, float] = field(default_factory=dict)  # window key → horizon (s)
    uses_processes: bool = False
    _calendar: Calendar | None = None

    @property
    def calendar(self) -> Calendar:
        """The policy's local time and holidays (built once per compile)."""
        if self._calendar is None:
            self._calendar = Calendar(self.doc.timezone, self.doc.holidays)
        return self._calendar

    def _need(self, key: str, window_s: float) -> None:
        self.needs[key] = max(self.needs.get(key, 0.0), window_s)

    def compile(self, cond: Any, key: str) -> Node | None:
        if cond is None:
            return None
        if isinstance(cond, MetricCondition):
            if cond.metric in GPU_ATTR:
                keys = [f"{d.id}/{GPU_ATTR[cond.metric]}" for d in selectors.gpus(self.devices)]
            elif cond.metric in CPU_KEY:
                keys = [CPU_KEY[cond.metric]]
            else:
                keys = [c.id for c in selectors.select_temperatures(cond.sensor or [], self.devices)]
            for k in keys:
                self._need(k, cond.window_s)
            return Metric(key, cond, keys)
        if isinstance(cond, AllCondition):
            return All(key, cond.sustain_s,
                       [self.compile(c, f"{key}.all[{i}]") for i, c in enumerate(cond.all)])
        if isinstance(cond, AnyCondition):
            return AnyOf(key, cond.sustain_s,
                         [self.compile(c, f"{key}.any[{i}]") for i, c in enumerate(cond.any)])
        if isinstance(cond, NotCondition):
            return Not(key, cond.sustain_s, self.compile(cond.not_, f"{key}.not"))  # type: ignore[arg-type]
        if isinstance(cond, ScheduleCondition):
            spec = cond.schedule
            spec = self.doc.schedules.get(spec, []) if isinstance(spec, str) else spec
            return Schedule(key, cond, compile_periods(spec if isinstance(spec, list) else [spec]),
                            self.calendar)
        if isinstance(cond, ProcessCondition):
            self.uses_processes = True
            return Process(key, cond)
        if isinstance(cond, StateCondition):
            machine, state = resolve_state(self.doc, cond.state) or ("", cond.state)
            m = self.doc.machines.get(machine)
            return InState(key, cond, machine, state, per_gpu=m is not None and m.per == "gpu")
        raise TypeError(f"unknown condition {type(cond).__name__}")
