"""A fan curve's source on one machine: required inputs, optional ones, and alternatives in order.

Compiled once per plan (:func:`compile_source`), that is for the devices the machine has now (again after a
hotplug or a reload): every entry of the source's list becomes inputs, one per channel — a plain pattern
or ``{sensor}`` the channels it matches; ``{first: [...]}`` the channels of the first listed alternative
that matches any channel on this machine (Tctl/Tdie on AMD, ``Package id *`` on Intel, a board thermistor
where neither driver is loaded). Alternatives choose among the sensors a machine *has*; they never stand in
for one that fails: a chosen channel that fails, reads nonsense or goes stale sends the curve's fans to
full (the product's safety rule), unless its entry is ``optional: true`` — then it is left out of the
aggregate while it fails. With no input reading at all the source fails too. ``{same_gpu: [...]}`` is
compiled per GPU (``gpu``): the named channels of the GPU whose fans the rule drives.

A required entry that matches no channel (:func:`unmatched`) is a sensor this machine lacks. When it names
a device this machine has (``gpu*/temprature`` on a machine with GPUs: the channel is misspelt), or one
device exactly (``gpu9/temperature``: that GPU is absent, as if it had failed), it stays an input that
never reads: the source fails and the fans go to full, as for a failed sensor. A pattern for a kind of
device the machine does not have (``gpu*/temperature`` without a GPU, a label such as ``Tdie``) requires
nothing here. Both are warned about (``aithermd check``, the daemon at start and on reload).

Resolved every tick (:func:`resolve`). The window key of a smoothed source (:func:`key`,
:func:`parse_key`) encodes its inputs, so two curves over the same inputs share one window:
``source:max|a;?b`` (``;`` between inputs, ``?`` before an optional one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from aithermd.model import Device, Status
from aithermd.policy import selectors

PREFIX = "source:"
_OK = Status.OK


@dataclass(frozen=True, slots=True)
class Input:
    """One channel of a source; ``optional``: left out while it fails instead of failing the source."""

    channel: str
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Resolved:
    """One tick's source: ``value`` (°C, None when the source failed), the channels ``used``, and the first
    ``failed`` required input as (channel id, status text) when the source failed."""

    value: float | None
    used: tuple[str, ...]
    failed: tuple[str, str] | None = None


def entries(agg: Any) -> tuple[str, list[Any]]:
    """``(fn, items)`` of a schema ``SourceAgg``: the aggregate name and its list."""
    fn = next(k for k in ("max", "min", "mean") if getattr(agg, k) is not None)
    return fn, list(getattr(agg, fn))


def patterns(agg: Any) -> list[str]:
    """Every sensor pattern a source names (all alternatives), for checks and documentation."""
    out: list[str] = []
    for item in entries(agg)[1]:
        if isinstance(item, str):
            out.append(item)
        elif item.sensor is not None:
            out.extend(item.sensor)
        elif item.same_gpu is not None:
            out.extend(f"gpu*/{name}" for name in item.same_gpu)
        else:
            for alt in item.first:
                out.extend(alt)
    return out


def uses_same_gpu(agg: Any) -> bool:
    """Whether a source names channels of the fan's own GPU (``same_gpu``): compiled per GPU then."""
    return any(not isinstance(item, str) and item.same_gpu is not None for item in entries(agg)[1])


def compile_source(agg: Any, devices: Sequence[Device],
                   gpu: str | None = None) -> tuple[str, tuple[Input, ...]]:
    """``(fn, inputs)`` of a schema ``SourceAgg`` on ``devices``, with ``gpu`` (a device id) the GPU whose
    fans are driven (for ``same_gpu``); a channel is never read twice."""
    fn, items = entries(agg)
    inputs: list[Input] = []
    taken: set[str] = set()
    for item in items:
        optional = not isinstance(item, str) and item.optional
        if not isinstance(item, str) and item.same_gpu is not None:
            own = [d for d in devices if d.id == gpu]
            chosen = [c for d in own for c in d.channels
                      if any(fnmatchcase(c.attribute, p) for p in item.same_gpu)]
        elif isinstance(item, str) or item.sensor is not None:
            chosen = selectors.select_temperatures([item] if isinstance(item, str) else item.sensor, devices)
        else:
            chosen = next((found for alt in item.first
                           if (found := selectors.select_temperatures(alt, devices))), [])
        for c in chosen:
            if c.id not in taken:
                taken.add(c.id)
                inputs.append(Input(c.id, optional))
        if not optional and (isinstance(item, str) or item.sensor is not None):
            for p in [item] if isinstance(item, str) else item.sensor:
                if p not in taken and required_here(p, devices) \
                        and not selectors.select_temperatures([p], devices):  # never reads: the source fails
                    taken.add(p)
                    inputs.append(Input(p))
    return fn, tuple(inputs)


def required_here(pattern: str, devices: Sequence[Device]) -> bool:
    """Whether a required pattern that matches no channel still requires one here (see the module doc): it
    names one device exactly, or its device part (before the last ``/``) matches a device of ``devices``."""
    if "/" not in pattern:
        return False
    device = pattern.rsplit("/", 1)[0]
    if not any(ch in device for ch in "*?["):
        return True
    return any(fnmatchcase(d.id, device) for d in devices)


def unmatched(agg: Any, devices: Sequence[Device]) -> list[tuple[int, str, bool]]:
    """``(index in the list, pattern, required here)`` for each pattern of a source's plain, ``sensor``
    or optional entries that matches no temperature channel on ``devices`` (``first`` alternatives are
    meant to miss, ``same_gpu`` is the fan's own GPU); ``required here``: the fans go to full for it."""
    out = []
    for i, item in enumerate(entries(agg)[1]):
        if not isinstance(item, str) and item.sensor is None:
            continue
        optional = not isinstance(item, str) and item.optional
        for p in [item] if isinstance(item, str) else item.sensor:
            if not selectors.select_temperatures([p], devices):
                out.append((i, p, not optional and required_here(p, devices)))
    return out


def channels(inputs: Sequence[Input]) -> tuple[str, ...]:
    """Every channel the inputs read, in order."""
    return tuple(inp.channel for inp in inputs)


def resolve(fn: str, inputs: Sequence[Input], readings: Mapping[str, Any]) -> Resolved:
    """This tick's value of a compiled source (see the module doc)."""
    values: list[float] = []
    used: list[str] = []
    failed: tuple[str, str] | None = None
    get = readings.get
    for inp in inputs:
        r = get(inp.channel)
        v = None if r is None or r.status is not _OK or r.value is None or r.value != r.value else r.value
        if v is not None:
            values.append(float(v))
            used.append(inp.channel)
        elif not inp.optional and failed is None:
            failed = (inp.channel, str(r.status) if r is not None else "missing")
    if failed is not None or not values:
        return Resolved(None, tuple(used), failed or ("(no source)", "missing"))
    value = max(values) if fn == "max" else min(values) if fn == "min" else sum(values) / len(values)
    return Resolved(value, tuple(used))


def key(fn: str, inputs: Sequence[Input]) -> str:
    """The window key of a smoothed source (see the module doc)."""
    return f"{PREFIX}{fn}|{';'.join(('?' if i.optional else '') + i.channel for i in inputs)}"


def parse_key(text: str) -> tuple[str, tuple[Input, ...]]:
    """The inverse of :func:`key`."""
    fn, body = text[len(PREFIX):].split("|", 1)
    return fn, tuple(Input(part.lstrip("?"), part.startswith("?")) for part in body.split(";") if part)
