"""Reading ``operator.json`` back at start: every part checked as the D-Bus calls check it.

The file is the daemon's own, but a hand edit, an older version or a disk fault can leave valid JSON of
the wrong shape (``[1]``, ``{"overrides": [1]}``, ``{"holds": 5}``) or values the D-Bus calls refuse
(``SetOverride`` of -50 % or 1e9 %). Each part is taken on its own: what is good is kept, what is not is
dropped with the reason, and a file that had anything dropped is moved aside to ``operator.json.bad``
(the last one kept) so that nobody loses it and the daemon starts with the good part.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from aithermd.errors import AithermError
from aithermd.files import UntrustedStateFile, read_state_file
from aithermd.model import Hold, Knob

BAD_SUFFIX = ".bad"
_HOLD_TYPES = {"cookie": (int,), "policy": (str,), "reason": (str,), "owner": (str,),
               "uid": (int, type(None)), "created": (int, float), "expires": (int, float, type(None)),
               "detached": (bool,)}


@dataclass
class OperatorState:
    """What ``operator.json`` brings back: the active policy (None: not kept), overrides (knob id →
    (value in the knob's unit, expiry in wall-clock s or None)), holds, and each part ``dropped`` with why."""

    active: str | None = None
    overrides: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    holds: list[Hold] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def read_operator_state(path: Path, knobs: Mapping[str, Knob]) -> OperatorState:
    """The checked content of ``path``; ``knobs``: id → Knob of the devices found now. Raises
    FileNotFoundError when there is none, UntrustedStateFile (another user's, writable by others, a
    symlink: not read), OSError/ValueError when it cannot be read or is not JSON."""
    doc = json.loads(read_state_file(path).decode())  # not another user's, never through a symlink
    out = OperatorState()
    if not isinstance(doc, dict):
        out.dropped.append(f"the whole file: a JSON {type(doc).__name__}, not an object")
        return out
    active = doc.get("active_policy")
    if isinstance(active, str) and active:
        out.active = active
    elif active is not None:
        out.dropped.append(f"active_policy {active!r}: not a policy name")
    overrides = doc.get("overrides") or {}
    if not isinstance(overrides, dict):
        out.dropped.append(f"overrides: a JSON {type(overrides).__name__}, not an object")
        overrides = {}
    for knob_id, entry in overrides.items():
        try:
            out.overrides[str(knob_id)] = _override(str(knob_id), entry, knobs)
        except (AithermError, KeyError, TypeError, ValueError) as exc:
            out.dropped.append(f"override {knob_id}: {exc}")
    holds = doc.get("holds") or []
    if not isinstance(holds, list):
        out.dropped.append(f"holds: a JSON {type(holds).__name__}, not a list")
        holds = []
    for raw in holds:
        problem = _hold_problem(raw)
        if problem:
            out.dropped.append(f"hold {raw!r}: {problem}")
        else:
            out.holds.append(Hold(**raw))
    return out


def _override(knob_id: str, entry: Any, knobs: Mapping[str, Knob]) -> tuple[float, float | None]:
    if not isinstance(entry, dict) or "value" not in entry:
        raise TypeError("not an object with a 'value'")
    value, expires = entry["value"], entry.get("expires_wall")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"value {value!r} is not a number")
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))
                                or not math.isfinite(expires)):
        raise ValueError(f"expires_wall {expires!r} is not a time")
    knob = knobs.get(knob_id)
    if knob is not None:  # the checks of D-Bus SetOverride; an absent device's knob is checked when back
        value = check_override(knob, float(value))
    return float(value), None if expires is None else float(expires)


def check_override(knob: Knob, value: float) -> float:
    """``value`` for ``knob`` as ``SetOverride`` takes it (clamped just outside the range). Raises
    InvalidArgument (read-only knob, no number), OutOfRange."""
    from aithermd.errors import InvalidArgument
    from aithermd.runtime.control import clamp_request
    if not knob.writable:
        raise InvalidArgument(f"{knob.id} is read-only: {knob.why_not or 'not writable'}")
    return clamp_request(knob, value)


def usable_overrides(overrides: Mapping[str, tuple[float, float | None]],
                     knobs: Mapping[str, Knob]) -> dict[str, float]:
    """Knob id → value of the overrides the engine may apply now: a kept override of a knob absent at
    start is checked as ``SetOverride`` checks once the knob is there, and left out while it fails."""
    out = {}
    for knob_id, (value, _) in overrides.items():
        knob = knobs.get(knob_id)
        if knob is None:
            out[knob_id] = value  # the engine ignores unknown knobs
            continue
        try:
            out[knob_id] = check_override(knob, value)
        except AithermError:
            continue
    return out


def _hold_problem(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return f"a JSON {type(raw).__name__}, not an object"
    names = {f.name for f in fields(Hold)}
    extra = sorted(set(raw) - names)
    if extra:
        return f"unknown field(s) {', '.join(extra)}"
    for name in ("cookie", "policy", "reason", "owner"):
        if name not in raw:
            return f"no {name}"
    for name, types in _HOLD_TYPES.items():
        if name in raw and (not isinstance(raw[name], types)
                            or (bool not in types and isinstance(raw[name], bool))):
            return f"{name} {raw[name]!r} is not a {'/'.join(t.__name__ for t in types)}"
    return None


def is_untrusted(exc: BaseException) -> bool:
    return isinstance(exc, UntrustedStateFile)


def move_aside(path: Path) -> Path | None:
    """Rename ``path`` to ``path.bad`` (over an earlier one); the new path, or None when it failed."""
    target = Path(str(path) + BAD_SUFFIX)
    try:
        os.replace(path, target)
    except OSError:
        return None
    return target
