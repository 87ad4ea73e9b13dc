"""A stand-in for the policy engine with the same contract, for the daemon's own tests.

Policy files are YAML mappings: ``description``, ``duty_pct`` (a number, or ``null`` = hand the fans
back) and optionally ``explode: true`` (evaluate raises). Safety: a fan whose device has a failed or
implausible temperature goes to 100 %. Overrides win over policies; the last hold wins over the active
policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.model import Decision, KnobKind, Layer, Status
from aithermd.runtime.world import Engine


@dataclass(frozen=True, eq=False)
class StubPolicy:
    name: str
    path: Path
    description: str
    source: str
    duty_pct: float | None
    explode: bool = False
    doc: dict = field(default_factory=dict)


def load_policies(dirs, *, strict_permissions=False, skip=(), parsed=None):
    out, errors = {}, []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.yaml")):
            if str(f) in skip:
                continue
            text = f.read_text()
            try:
                doc = YAML(typ="rt").load(text) or {}
            except YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                errors.append(PolicyError(str(f), "not valid YAML", line=mark.line + 1 if mark else None))
                continue
            if "duty_pct" not in doc:
                errors.append(PolicyError(str(f), "missing", line=1, col=1, key="duty_pct"))
                continue
            duty = doc["duty_pct"]
            if duty is not None and not isinstance(duty, (int, float)):
                line, col = doc.lc.value("duty_pct")
                errors.append(PolicyError(str(f), "not a number", line=line + 1, col=col + 1,
                                          key="duty_pct"))
                continue
            duty = None if duty is None else float(duty)
            out[f.stem] = StubPolicy(f.stem, f, str(doc.get("description", "")), text, duty,
                                     bool(doc.get("explode")), dict(doc))
    if errors:
        raise PolicyErrors(errors)
    return out


@dataclass(frozen=True)
class StubInput:
    t_mono: float
    t_wall: float
    devices: Any
    readings: Any
    knobs: Any
    attrs: Any
    processes: Any
    fan_alarms: Any = None


def evaluate(active, holds, inp, state, overrides):
    policy = holds[-1] if holds else active
    if policy.explode:
        raise RuntimeError("engine bug")
    decisions = {}
    for dev in inp.devices:
        failed = any(inp.readings.get(c.id) is not None and inp.readings[c.id].status
                     in (Status.FAILED, Status.IMPLAUSIBLE) for c in dev.channels)
        for knob in dev.knobs:
            if knob.kind is not KnobKind.PWM:
                continue
            if failed:
                decisions[knob.id] = Decision(knob.id, 100.0, Layer.SAFETY, "safety/sensor_failed")
            elif knob.id in overrides:
                decisions[knob.id] = Decision(knob.id, overrides[knob.id], Layer.OVERRIDE, "override")
            elif policy.duty_pct is not None:
                layer = Layer.HOLD if holds else Layer.POLICY
                decisions[knob.id] = Decision(knob.id, policy.duty_pct, layer, f"{policy.name}/fans",
                                              requested=policy.duty_pct)
            else:
                decisions[knob.id] = Decision(knob.id, None, Layer.DEFAULT, "default")
    return SimpleNamespace(decisions=decisions, state=state + 1, states={policy.name: {"machine": "on"}})


def initial_state(*_args, **_kwargs):
    return 0


def needs_processes(_policies):
    return False


STUB_ENGINE = Engine(load_policies, evaluate, initial_state, needs_processes, StubInput)


def write_policy(directory: Path, name: str, duty: float | None, **extra: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    lines = [f"description: {name} test policy", f"duty_pct: {'null' if duty is None else duty}"]
    lines += [f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
