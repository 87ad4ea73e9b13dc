"""A validated policy document as plain data: its node kinds, their JSON form, and its value forms.

The schema (:mod:`aithermd.policy.schema`, pydantic) validates a policy file once; the engine only reads the
result. Each schema model is also one of the kinds here (``class MixCurve(Model, kinds.MixCurve)``), so the
engine's ``isinstance`` checks and attribute reads hold for a pydantic model and for a :class:`Node` alike,
and importing the engine imports no pydantic. :func:`to_json` turns a validated document into JSON-able
data and :func:`from_json` gives it back as nodes: the daemon keeps that form in its state directory
(:mod:`aithermd.runtime.parsed`) and starts again from it without importing pydantic, building the schema's
validators or parsing YAML (about 15 MB and 0.15 s of CPU on a small machine).

Also here, without pydantic: the value forms the engine parses (:func:`parse_power`, :func:`parse_clock`,
:func:`parse_holiday`), the days, and the built-in safety margin.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
BUILTIN_MARGIN_C = 5.0  # built-in safety margin under a device's own slowdown/critical threshold, °C


class Node:
    """One node of a validated document: its fields as attributes, read-only. Equal to a node of the same
    kind with equal fields; hashable when its fields are (as a frozen pydantic model is)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self.__dict__.values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


# one kind per schema model (the schema's classes derive from these)
class SourceInput(Node): pass  # noqa: E701
class SourceAgg(Node): pass  # noqa: E701
class GpuMatch(Node): pass  # noqa: E701
class FanMatch(Node): pass  # noqa: E701
class MetricCondition(Node): TAG = "metric"  # noqa: E701 - its tag in a document
class AllCondition(Node): TAG = "all"  # noqa: E701 - its tag in a document
class AnyCondition(Node): TAG = "any"  # noqa: E701 - its tag in a document
class NotCondition(Node): TAG = "not"  # noqa: E701 - its tag in a document
class Schedule(Node): pass  # noqa: E701
class ScheduleCondition(Node): TAG = "schedule"  # noqa: E701 - its tag in a document
class ProcessCondition(Node): TAG = "process"  # noqa: E701 - its tag in a document
class StateCondition(Node): TAG = "state"  # noqa: E701 - its tag in a document
class PointsCurve(Node): pass  # noqa: E701
class PidCurve(Node): pass  # noqa: E701
class MixCurve(Node): pass  # noqa: E701
class State(Node): pass  # noqa: E701
class Machine(Node): pass  # noqa: E701
class GpuPowerLimitRule(Node): pass  # noqa: E701
class GpuClocksRule(Node): pass  # noqa: E701
class CpuPowerLimitRule(Node): pass  # noqa: E701
class FanRule(Node): pass  # noqa: E701
class Safety(Node): pass  # noqa: E701
class PolicyDocument(Node): pass  # noqa: E701
class Budget(Node): pass  # noqa: E701
class FanCeiling(Node): pass  # noqa: E701
class Quiet(Node): pass  # noqa: E701


class CpuKnobsRule(Node):
    def wanted(self) -> dict[str, str]:
        """Knob kind → the choice asked (boost as ``on``/``off``)."""
        out = {k: getattr(self, k) for k in ("epp", "governor", "platform_profile")
               if getattr(self, k) is not None}
        if self.boost is not None:
            out["boost"] = "on" if self.boost else "off"
        return out


KINDS: dict[str, type[Node]] = {c.__name__: c for c in Node.__subclasses__()}


def _kind(obj: Node) -> type[Node]:
    for cls in type(obj).__mro__:
        if KINDS.get(cls.__name__) is cls:
            return cls
    raise TypeError(f"{type(obj).__name__} is not a policy document kind")


def to_json(value: Any) -> Any:
    """A validated document (schema models or nodes) → JSON-able data: a node as ``{"$": kind, "f":
    {field: value}}``, a mapping as ``{"$d": {...}}``, a tuple as ``{"$t": [...]}``. Raises TypeError for a
    value JSON cannot carry exactly (the caller then keeps nothing)."""
    if isinstance(value, Node):
        return {"$": _kind(value).__name__, "f": {k: to_json(v) for k, v in vars(value).items()}}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a mapping with keys that are not strings")
        return {"$d": {k: to_json(v) for k, v in value.items()}}
    if isinstance(value, tuple):
        return {"$t": [to_json(v) for v in value]}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise TypeError(f"{type(value).__name__} is not kept as JSON")


def from_json(data: Any) -> Any:
    """:func:`to_json`'s form → nodes, dicts, tuples, lists and scalars. Raises ValueError for anything
    else (an unknown kind, a malformed entry)."""
    if isinstance(data, list):
        return [from_json(v) for v in data]
    if isinstance(data, dict):
        if "$" in data:
            cls = KINDS.get(data["$"]) if isinstance(data["$"], str) else None
            fields = data.get("f")
            if cls is None or not isinstance(fields, dict):
                raise ValueError(f"not a policy document node: {str(data)[:80]}")
            return cls(**{k: from_json(v) for k, v in fields.items()})
        if "$d" in data and isinstance(data["$d"], dict):
            return {k: from_json(v) for k, v in data["$d"].items()}
        if "$t" in data and isinstance(data["$t"], list):
            return tuple(from_json(v) for v in data["$t"])
        raise ValueError(f"not a policy document value: {str(data)[:80]}")
    if data is None or isinstance(data, bool | int | float | str):
        return data
    raise ValueError(f"not a policy document value: {data!r}")


# ----- value forms -----------------------------------------------------------------------------------
_POWER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|W)?\s*$", re.ASCII)  # '٣٠٠' is no number here


def parse_power(value: float | str) -> tuple[str, float]:
    """A power value → ``("w", W)``, ``("pct", % of default)``, ``("default"|"min"|"max"|"efficient", 0)``.

    Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("expected watts (300 or '300 W'), a percentage of the default ('80%'), "
                         "'default', 'min', 'max' or 'efficient'")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a power value: expected a finite number of watts")
        if value <= 0:
            raise ValueError("a power limit must be more than 0 W")
        return ("w", float(value))
    text = str(value).strip()
    if text in ("default", "min", "max", "efficient"):
        return (text, 0.0)
    m = _POWER.match(text)
    if not m:
        raise ValueError(f"'{value}' is not a power value: expected watts (300 or '300 W'), a percentage "
                         "of the default ('80%'), 'default', 'min', 'max' or 'efficient'")
    number = float(m.group(1))
    if m.group(2) == "%":
        if not 1 <= number <= 200:
            raise ValueError(f"{number:g}% of the default is out of range (1–200 %)")
        return ("pct", number)
    if number <= 0:
        raise ValueError("a power limit must be more than 0 W")
    return ("w", number)


_CLOCK = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|MHz)?\s*$", re.ASCII)


def parse_clock(value: float | str) -> tuple[str, float]:
    """An SM clock value (the top of a locked range) → ``("w", MHz)`` (the knob's own unit),
    ``("pct", % of the top clock)``, ``("min"|"max"|"efficient", 0)``. Raises ValueError with the forms."""
    forms = ("expected MHz (1500 or '1500 MHz'), a percentage of the top clock ('60%'), 'min', 'max' or "
             "'efficient'")
    if isinstance(value, bool):
        raise ValueError(forms)
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{value} is not a clock: {forms}")
        return ("w", float(value))
    text = str(value).strip()
    if text in ("min", "max", "efficient"):
        return (text, 0.0)
    m = _CLOCK.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"'{value}' is not a clock: {forms}")
    number = float(m.group(1))
    if m.group(2) == "%":
        if not 1 <= number <= 100:
            raise ValueError(f"{number:g}% of the top clock is out of range (1–100 %)")
        return ("pct", number)
    return ("w", number)


def parse_holiday(text: str) -> tuple[int | None, int, int]:
    """``"2026-12-24"`` → (2026, 12, 24); ``"12-25"`` (every year) → (None, 12, 25). Raises ValueError."""
    parts = text.strip().split("-")
    try:
        if len(parts) == 3:
            d = dt.date(int(parts[0]), int(parts[1]), int(parts[2]))
            return d.year, d.month, d.day
        if len(parts) == 2:
            dt.date(2000, int(parts[0]), int(parts[1]))  # a leap year: 02-29 is a date
            return None, int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise ValueError(f"'{text}' is not a date: write YYYY-MM-DD, or MM-DD for every year")
