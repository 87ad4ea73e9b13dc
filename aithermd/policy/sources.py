"""A fan curve's source on one machine: required inputs, optional ones, and alternatives in order.

Compiled once per plan (:func:`compile_source`): every entry of the source's list becomes one or more
:class:`Input` — a plain pattern one required input per channel it matches; ``{sensor, optional}`` one
input per channel; ``{first: [...]}`` one input whose alternatives are the listed patterns that match a
channel here, in order (an alternative that matches nothing on this machine is dropped). Resolved every
tick (:func:`resolve`): an input reads the channels of its first alternative of which at least one reads ok
(those that read); a required input of which nothing reads fails the source, an optional one is left out.
With no input left the source has no value and fails too: its fans go to full.

The window key of a smoothed source (:func:`key`, :func:`parse_key`) encodes its inputs, so two curves over
the same inputs share one window: ``source:max|a;?b;c>d,e`` (``;`` between inputs, ``?`` optional, ``>``
between alternatives, ``,`` between an alternative's channels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aithermd.model import Device, Status
from aithermd.policy import selectors

PREFIX = "source:"
_OK = Status.OK


@dataclass(frozen=True, slots=True)
class Input:
    """``alternatives``: channel-id tuples in order of preference; ``optional``: may be left out."""

    alternatives: tuple[tuple[str, ...], ...]
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
        else:
            for alt in item.first:
                out.extend(alt)
    return out


def compile_source(agg: Any, devices: Sequence[Device]) -> tuple[str, tuple[Input, ...]]:
    """``(fn, inputs)`` of a schema ``SourceAgg`` on ``devices``; a channel is never read twice."""
    fn, items = entries(agg)
    inputs: list[Input] = []
    taken: set[str] = set()

    def fresh(chans: Sequence[Any]) -> tuple[str, ...]:
        return tuple(c.id for c in chans if c.id not in taken)

    for item in items:
        if isinstance(item, str) or item.sensor is not None:
            pats = [item] if isinstance(item, str) else item.sensor
            optional = False if isinstance(item, str) else item.optional
            for cid in fresh(selectors.select_temperatures(pats, devices)):
                taken.add(cid)
                inputs.append(Input(((cid,),), optional))
        else:
            alts = []
            for alt in item.first:
                ids = fresh(selectors.select_temperatures(alt, devices))
                if ids:
                    alts.append(ids)
            if alts:
                taken.update(c for a in alts for c in a)
                inputs.append(Input(tuple(alts), item.optional))
    return fn, tuple(inputs)


def channels(inputs: Sequence[Input]) -> tuple[str, ...]:
    """Every channel the inputs may read, in order."""
    return tuple(dict.fromkeys(c for inp in inputs for alt in inp.alternatives for c in alt))


def _value(r: Any) -> float | None:
    if r is None or r.status is not _OK:
        return None
    v = r.value
    return None if v is None or v != v else float(v)


def resolve(fn: str, inputs: Sequence[Input], readings: Mapping[str, Any]) -> Resolved:
    """This tick's value of a compiled source (see the module doc)."""
    values: list[float] = []
    used: list[str] = []
    failed: tuple[str, str] | None = None
    get = readings.get
    for inp in inputs:
        found = False
        for alt in inp.alternatives:
            for cid in alt:
                v = _value(get(cid))
                if v is not None:
                    values.append(v)
                    used.append(cid)
                    found = True
            if found:
                break
        if not found and not inp.optional and failed is None:
            cid = inp.alternatives[0][0]
            r = get(cid)
            failed = (cid, str(r.status) if r is not None else "missing")
    if failed is not None or not values:
        return Resolved(None, tuple(used), failed or ("(no source)", "missing"))
    value = max(values) if fn == "max" else min(values) if fn == "min" else sum(values) / len(values)
    return Resolved(value, tuple(used))


def key(fn: str, inputs: Sequence[Input]) -> str:
    """The window key of a smoothed source (see the module doc)."""
    parts = [("?" if inp.optional else "") + ">".join(",".join(alt) for alt in inp.alternatives)
             for inp in inputs]
    return f"{PREFIX}{fn}|{';'.join(parts)}"


def parse_key(text: str) -> tuple[str, tuple[Input, ...]]:
    """The inverse of :func:`key`."""
    fn, body = text[len(PREFIX):].split("|", 1)
    inputs = []
    for part in body.split(";") if body else ():
        optional = part.startswith("?")
        alts = tuple(tuple(alt.split(",")) for alt in part.lstrip("?").split(">"))
        inputs.append(Input(alts, optional))
    return fn, tuple(inputs)
