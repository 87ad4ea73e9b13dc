"""The built-in safety layer: it always applies, above every policy, and policies can only make it stricter.

- A temperature at or above its device's own threshold minus a margin is critical: NVML ``slowdown`` (else
  ``shutdown``) for GPUs, hwmon ``crit`` (else ``emergency``) for the rest (thresholds as the hwmon sysfs ABI
  and NVML report them). The device's power limit goes to its minimum and the fans it feeds go to full:
  the GPU's own fans; hwmon fans whose curve reads that sensor; a GPU hwmon chip's (amdgpu) own pwm; and for
  CPU temperature chips (coretemp, k10temp, zenpower) the RAPL package PL1/PL2. The latch releases
  :data:`RELEASE_C` below the trigger, so a temperature at the edge does not flap.
- A fan whose source failed, is implausible, stale, or missing goes to full (100 %), never to zero. The
  policy's rules say which failures count (``fan_failed``): an optional input that fails, or an alternative
  with a later one that reads, does not; without that word every source channel must read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aithermd.model import Decision, Device, DeviceKind, Knob, KnobKind, Layer, Quantity, Reading, Status

RELEASE_C = 3.0
GPU_THRESHOLDS = ("slowdown", "shutdown")
HWMON_THRESHOLDS = ("crit", "emergency")
CPU_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal")
GPU_CHIPS = ("amdgpu", "nouveau", "radeon")
FULL_PCT = 100.0


@dataclass(frozen=True, slots=True)
class SafetyParams:
    """``margin_c`` under each threshold (≥ the built-in 5 °C); ``gpu_temp_limit_c`` an absolute ceiling."""

    margin_c: float = 5.0
    gpu_temp_limit_c: float | None = None


def trigger_c(device: Device, thresholds: Mapping[str, float], params: SafetyParams) -> float | None:
    """The temperature (°C) at which a channel of ``device`` is critical, or None when it has no threshold."""
    names = GPU_THRESHOLDS if device.kind == DeviceKind.GPU else HWMON_THRESHOLDS
    thr = next((thresholds[n] for n in names if thresholds.get(n) is not None), None)
    trig = None if thr is None else thr - params.margin_c
    if device.kind == DeviceKind.GPU and params.gpu_temp_limit_c is not None:
        trig = params.gpu_temp_limit_c if trig is None else min(trig, params.gpu_temp_limit_c)
    return trig


def _ok(r: Reading | None) -> bool:
    return r is not None and r.status == Status.OK and r.value is not None and math.isfinite(r.value)


@dataclass(frozen=True)
class SafetyPlan:
    """What :func:`evaluate` needs from one device tuple, computed once: each temperature channel with a
    trigger, the knobs by id, and the devices by id."""

    devices: tuple[Device, ...]
    params: SafetyParams
    triggers: tuple[tuple[str, float], ...]
    knobs: Mapping[str, Knob]
    by_id: Mapping[str, Device]


def plan(devices: Sequence[Device], params: SafetyParams) -> SafetyPlan:
    triggers = []
    for d in devices:
        for c in d.channels:
            if c.quantity == Quantity.TEMPERATURE:
                trig = trigger_c(d, c.thresholds, params)
                if trig is not None:
                    triggers.append((c.id, trig))
    return SafetyPlan(tuple(devices), params, tuple(triggers), {k.id: k for d in devices for k in d.knobs},
                      {d.id: d for d in devices})


def critical_channels(sp: SafetyPlan, readings: Mapping[str, Reading],
                      latched: frozenset[str]) -> dict[str, tuple[float, float]]:
    """Channel id → (temperature, trigger) for every critical temperature, with release hysteresis."""
    out = {}
    for cid, trig in sp.triggers:
        r = readings.get(cid)
        if not _ok(r):
            continue
        value = float(r.value)  # type: ignore[union-attr, arg-type]
        if value >= trig or (cid in latched and value > trig - RELEASE_C):
            out[cid] = (value, trig)
    return out


def _decide(knob: Knob, value: float | None, rule: str, reason: str, inputs: dict) -> Decision | None:
    if value is None:
        return None
    return Decision(knob_id=knob.id, value=knob.clamp(value), layer=Layer.SAFETY, rule=f"safety/{rule}",
                    reason=reason, requested=value, inputs=inputs)


def evaluate(sp: SafetyPlan, readings: Mapping[str, Reading], fan_sources: Mapping[str, Iterable[str]],
             latched: frozenset[str], *, fan_failed: Mapping[str, tuple[str, str]] | None = None
             ) -> tuple[dict[str, Decision], frozenset[str]]:
    """Safety decisions per knob id and the channels latched critical (the next call's ``latched``).

    ``sp``: :func:`plan` of the devices; ``fan_sources``: fan knob id → the temperature channel ids its curve
    may read (from the policies); ``fan_failed``: fan knob id → (channel, status) of the input that failed
    its source this tick (from the policies' rules); None: every channel in ``fan_sources`` must read."""
    decisions: dict[str, Decision] = {}
    devices, by_id, knobs = sp.devices, sp.by_id, sp.knobs
    critical = critical_channels(sp, readings, latched)
    fans_of: dict[str, list[str]] = {}
    if critical:
        for fan, sources in fan_sources.items():
            for ch in sources:
                fans_of.setdefault(ch, []).append(fan)

    for ch_id, (value, trig) in critical.items():
        dev = by_id.get(ch_id.rsplit("/", 1)[0])
        if dev is None:
            continue
        inputs = {ch_id: round(value, 2), "trigger_c": round(trig, 2)}
        why = f"{ch_id} at {value:g} °C ≥ {trig:g} °C (threshold − margin)"
        targets: list[tuple[Knob, float | None]] = []
        for k in dev.knobs:
            if k.kind in (KnobKind.POWER_LIMIT, KnobKind.PL1, KnobKind.PL2):
                targets.append((k, k.min))
            elif k.kind == KnobKind.FAN or (k.kind == KnobKind.PWM and dev.chip
                                            and dev.chip.startswith(GPU_CHIPS)):
                targets.append((k, FULL_PCT))
        targets += [(knobs[f], FULL_PCT) for f in fans_of.get(ch_id, ()) if f in knobs]
        if dev.kind == DeviceKind.HWMON and dev.chip and dev.chip.startswith(CPU_CHIPS):
            targets += [(k, k.min) for d in devices if d.kind == DeviceKind.POWERCAP for k in d.knobs
                        if k.kind in (KnobKind.PL1, KnobKind.PL2)]
        for knob, value_to in targets:
            dec = _decide(knob, value_to, "critical-temperature", why, inputs)
            if dec is not None and knob.id not in decisions:
                decisions[knob.id] = dec

    # fans whose source failed: full, never zero
    for fan, sources in fan_sources.items():
        knob = knobs.get(fan)
        if knob is None or fan in decisions:
            continue
        if fan_failed is not None:
            failed = fan_failed.get(fan)
        else:
            sources = tuple(sources)
            bad = [s for s in sources if not _ok(readings.get(s))] if sources else ["(no source)"]
            r = readings.get(bad[0]) if bad else None
            failed = (bad[0], r.status.value if r is not None else "missing") if bad else None
        if failed is not None:
            channel, status = failed
            dec = _decide(knob, FULL_PCT, "failed-source",
                          f"source {channel} is {status}: fan to full", {channel: status})
            if dec is not None:
                decisions[fan] = dec
    for d in devices:
        if d.kind != DeviceKind.GPU:
            continue
        temp = readings.get(f"{d.id}/temperature")
        if temp is None or _ok(temp):
            continue
        for k in d.knobs:
            if k.kind == KnobKind.FAN and k.id not in decisions:
                dec = _decide(k, FULL_PCT, "failed-source",
                              f"{d.id}/temperature is {temp.status.value}: fan to full",
                              {f"{d.id}/temperature": temp.status.value})
                if dec is not None:
                    decisions[k.id] = dec
    return decisions, frozenset(critical)
