"""The built-in safety layer: it always applies, above every policy, and policies can only make it stricter.

- A temperature at or above its device's own threshold minus a margin is critical: NVML ``slowdown`` (else
  ``shutdown``) for GPUs, hwmon ``crit`` (else ``emergency``) for the rest (thresholds as the hwmon sysfs ABI
  and NVML report them); an AMD CPU chip that exports none, :data:`CPU_DEFAULT_THRESHOLD_C`. The fans it feeds
  go to full: the GPU's own fans; hwmon fans whose curve reads that sensor; a GPU hwmon chip's (amdgpu) own
  pwm. A GPU's power limit is cut in proportion to how far over the trigger it reads (10 % of its draw at the
  trigger, never from above the limit in force: :func:`latch_draw_w`; 10 % more per °C over), to its minimum
  at the device's own threshold; for CPU temperature chips (coretemp, k10temp, zenpower) the RAPL package
  PL1/PL2 go to their minimum (:func:`package_floor_w`) and every board fan (the non-GPU hwmon pwms) to full. The latch holds its cut (deeper at most every 10 s) and
  releases only after 30 s at :data:`RELEASE_C` below the trigger (:mod:`aithermd.policy.safety_latch`), so a
  temperature at the edge does not flap. A released power cut leaves a *ceiling* on the knob
  (``safety/release-ramp``, :mod:`aithermd.policy.safety_ramp`) that rises a step per 30 s of calm, stops
  under a ceiling that tripped, and caps the policy's value (a min, :mod:`aithermd.policy.arbiter`) until it
  reaches the knob's maximum: a card that trips at its policy's value settles under it instead of cycling.
- A fan whose source failed, is implausible, stale, or missing goes to full (100 %), never to zero. The
  policy's rules say which failures count (``fan_failed``): an optional input that fails, or an alternative
  with a later one that reads, does not; without that word every source channel must read.
- A stalled fan (:mod:`aithermd.runtime.fanwatch`) goes to full: a kick-start, then for as long as it
  stalls. When detection confirmed that the stalled fan input follows that pwm, its *zone* — the
  temperature channels its curve reads — is a failed cooler: the other fans reading any of them go to full
  and the devices those channels belong to get the critical response's power limits (their minimum; RAPL
  PL1/PL2 for a CPU temperature chip), until the fan turns again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from aithermd.model import (
    Decision,
    Device,
    DeviceKind,
    Knob,
    KnobKind,
    KnobValue,
    Layer,
    Quantity,
    Reading,
    Status,
)
from aithermd.policy import safety_latch, safety_ramp
from aithermd.policy.safety_latch import RELEASE_C, Latch
from aithermd.policy.safety_ramp import KEY as RAMP_KEY

GPU_THRESHOLDS = ("slowdown", "shutdown")
HWMON_THRESHOLDS = ("crit", "emergency")
CPU_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal")
GPU_CHIPS = ("amdgpu", "nouveau", "radeon")
FULL_PCT = 100.0
POWER_KINDS = (KnobKind.POWER_LIMIT, KnobKind.PL1, KnobKind.PL2)
CRITICAL_RULE = "safety/critical-temperature"
# a new latch's reference draw is at least this share of the power limit in force (a 0.1× reading on the
# latching tick is no draw to cut from); a cut that then does not bind is cut again (safety_latch.UNBOUND)
LATCH_FLOOR_SHARE = 0.5


# A CPU temperature chip that exports no crit/emergency threshold (k10temp and zenpower on Zen parts give
# Tctl/Tdie/Tccd only: the kernel's k10temp exports thresholds for pre-Zen families alone; the recorded X470
# and X570 trees here have none) is given this one: above every AMD Tjmax ("Max. Operating Temperature
# (Tjmax)" in AMD's product specifications: 90-95 °C for desktop Ryzen 5000/7000/9000 and Threadripper 7000,
# 105 °C for mobile Ryzen 4000/5000 H parts, which run there in spec: attack5 C3), so a die over it is one
# the CPU's own throttling is not holding.
CPU_DEFAULT_THRESHOLD_C = 115.0
# intel_rapl exports no constraint_N_min_power_uw (no recorded zone has one), so a critical CPU temperature
# had no value to cut PL1/PL2 to and cut nothing (attack5 C11). With no minimum of its own a package is cut to
# this: the budget layer's lowest CPU share by default (schema: cpu_min_w), a desktop part's base-power class.
PACKAGE_FLOOR_W = 45.0
UNTHRESHOLDED_CPU_CHIPS = ("k10temp", "zenpower")


def threshold_c(device: Device, thresholds: Mapping[str, float]) -> float | None:
    """A temperature channel's own critical threshold (°C): NVML slowdown/shutdown for a GPU, hwmon
    crit/emergency otherwise, :data:`CPU_DEFAULT_THRESHOLD_C` for an AMD CPU chip exporting none."""
    names = GPU_THRESHOLDS if device.kind == DeviceKind.GPU else HWMON_THRESHOLDS
    thr = next((thresholds[n] for n in names if thresholds.get(n) is not None), None)
    if thr is None and device.chip is not None and device.chip.startswith(UNTHRESHOLDED_CPU_CHIPS):
        return CPU_DEFAULT_THRESHOLD_C
    return thr


@dataclass(frozen=True, slots=True)
class SafetyParams:
    """``margin_c`` under each threshold (≥ the built-in 5 °C); ``gpu_temp_limit_c`` an absolute ceiling."""

    margin_c: float = 5.0
    gpu_temp_limit_c: float | None = None


def trigger_c(device: Device, thresholds: Mapping[str, float], params: SafetyParams) -> float | None:
    """The temperature (°C) at which a channel of ``device`` is critical, or None when it has no threshold."""
    thr = threshold_c(device, thresholds)
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
    triggers: tuple[tuple[str, float], ...]  # channel id, trigger
    knobs: Mapping[str, Knob]
    by_id: Mapping[str, Device]
    thresholds: Mapping[str, float | None] = field(default_factory=dict)  # channel id → its own threshold


def plan(devices: Sequence[Device], params: SafetyParams) -> SafetyPlan:
    triggers, thresholds = [], {}
    for d in devices:
        for c in d.channels:
            if c.quantity == Quantity.TEMPERATURE:
                trig = trigger_c(d, c.thresholds, params)
                if trig is not None:
                    triggers.append((c.id, trig))
                    thresholds[c.id] = threshold_c(d, c.thresholds)
    return SafetyPlan(tuple(devices), params, tuple(triggers), {k.id: k for d in devices for k in d.knobs},
                      {d.id: d for d in devices}, MappingProxyType(thresholds))


def latch_draw_w(sp: SafetyPlan, device_id: str, readings: Mapping[str, Reading],
                 knobs: Mapping[str, KnobValue] | None) -> float | None:
    """The draw (W) a new latch of ``device_id`` cuts from: its ``power`` reading, kept between
    :data:`LATCH_FLOOR_SHARE` of the power limit in force and that limit (the lowest of its power-limit knobs'
    requested and enforced values in ``knobs``); None — the cut is then to the minimum — when the reading
    is missing or failed, or a power limit of the device cannot be read (a cut from an unbounded reading
    raised a 337.5 W limit to 415 W: attack9 N1). A card draws no more than its limit for longer than its
    power controller's window, so a reading above it on the latching tick is a glitch (one 2× sample made
    the "cut" 414 W over a 337.5 W limit: attack8 T1); one far under it (a 0.1× sample) cut a 200 W job to
    21 W for minutes (attack9 N3). A cut that does not bind is cut again from what the device draws
    (:mod:`aithermd.policy.safety_latch`)."""
    draw = readings.get(f"{device_id}/power")
    if not _ok(draw):
        return None  # no draw to cut from: the minimum at once, as the latch always did
    ref = float(draw.value)  # type: ignore[union-attr,arg-type]
    dev = sp.by_id.get(device_id)
    if dev is None or not knobs:
        return ref
    in_force = math.inf
    for k in dev.knobs:
        if k.kind != KnobKind.POWER_LIMIT:
            continue
        kv = knobs.get(k.id)
        if kv is None or kv.status != Status.OK or kv.value is None or not math.isfinite(kv.value):
            return None  # the limit in force is unknown: nothing bounds the reading
        for limit in (kv.value, kv.extra.get("enforced_w")):
            if limit is not None and math.isfinite(limit) and 0 < limit < in_force:
                in_force = float(limit)
    if in_force == math.inf:
        return ref
    return min(max(ref, LATCH_FLOOR_SHARE * in_force), in_force)


def critical_channels(sp: SafetyPlan, readings: Mapping[str, Reading], latched: Mapping[str, Latch],
                      now: float, released: dict[str, tuple[Latch, float]] | None = None,
                      knobs: Mapping[str, KnobValue] | None = None,
                      ) -> tuple[dict[str, tuple[float, float]], dict[str, Latch]]:
    """Channel id → (temperature, trigger) for every critical temperature, and the latches after this
    reading (:mod:`aithermd.policy.safety_latch`). A channel that fails to read keeps its latch. The
    latches released by this reading go into ``released`` (channel id → (the latch, its trigger)). A new
    latch cuts from :func:`latch_draw_w` (``knobs``: the knobs' values as read this tick)."""
    out, latches = {}, {}
    isfinite, ok = math.isfinite, Status.OK
    for cid, trig in sp.triggers:
        r = readings.get(cid)
        if r is None or r.status != ok or r.value is None or not isfinite(r.value):
            if cid in latched:
                latches[cid] = latched[cid]
                out[cid] = (math.nan, trig)
            continue
        if r.value < trig and cid not in latched:  # the common case: not critical, nothing latched
            continue
        thr = sp.thresholds.get(cid)
        value = float(r.value)
        prev = latched.get(cid)
        if prev is None:
            draw = latch_draw_w(sp, cid.rsplit("/", 1)[0], readings, knobs)
        else:  # what the device draws under the cut (safety_latch: a cut that never binds is cut again)
            r_w = readings.get(f"{cid.rsplit('/', 1)[0]}/power")
            draw = float(r_w.value) if _ok(r_w) else None  # type: ignore[union-attr,arg-type]
        latch = safety_latch.step(prev, value, trig, thr, now, draw)
        if latch is not None:
            latches[cid] = latch
            out[cid] = (value, trig)
        elif released is not None and cid in latched:
            released[cid] = (latched[cid], trig)
    return out, latches


def _critical_targets(dev: Device, devices: Sequence[Device], latch: Latch,
                      ) -> list[tuple[Knob, float | None]]:
    """The critical response of ``dev`` under ``latch``: :func:`_cooling` with its power limit cut in
    proportion (:func:`aithermd.policy.safety_latch.power_target_w`) rather than to its minimum."""
    return _cooling(dev, devices, latch)


def _ramps(sp: SafetyPlan, readings: Mapping[str, Reading], ramps: dict[str, safety_ramp.Ramp],
           released: Mapping[str, tuple[Latch, float]], decisions: dict[str, Decision], now: float) -> None:
    """Start a release ramp (:mod:`aithermd.policy.safety_ramp`) on each power knob a released latch had
    cut, step the others, drop those whose device is gone, and add their ceilings to ``decisions`` where
    nothing else of the safety layer decides the knob. ``ramps`` is updated in place."""
    for cid, (latch, trig) in released.items():
        dev = sp.by_id.get(cid.rsplit("/", 1)[0])
        for k, cut in _critical_targets(dev, sp.devices, latch) if dev is not None else ():
            if k.kind in POWER_KINDS:
                r = safety_ramp.start(k, cid, trig, cut, ramps.get(k.id), now)
                if r is None:
                    ramps.pop(k.id, None)
                else:
                    ramps[k.id] = r
    triggers = dict(sp.triggers)
    for kid, r in list(ramps.items()):
        knob = sp.knobs.get(kid)
        if knob is None:  # the device is gone: so is its ramp
            del ramps[kid]
            continue
        held = decisions.get(kid)
        if held is not None and held.rule == CRITICAL_RULE:  # latched again: the cut holds
            continue
        reading = readings.get(r.channel)
        nxt = safety_ramp.step(r, float(reading.value) if _ok(reading) else None,  # type: ignore[union-attr,arg-type]
                               triggers.get(r.channel), now)
        if nxt is None:  # at the top: the knob is the policy's again
            del ramps[kid]
            continue
        ramps[kid], dec = safety_ramp.decision(nxt, knob, now)
        decisions.setdefault(kid, dec)


def _cooling(dev: Device, devices: Sequence[Device], latch: Latch | None = None,
             ) -> list[tuple[Knob, float | None]]:
    """What cools ``dev`` down: its power limits to their minimum (a GPU's in proportion under ``latch``),
    its own fans (GPU fans, a GPU hwmon chip's pwm) to full, and for a CPU temperature chip the RAPL package
    PL1/PL2 to their minimum."""
    targets: list[tuple[Knob, float | None]] = []
    for k in dev.knobs:
        if k.kind == KnobKind.POWER_LIMIT and latch is not None:
            targets.append((k, safety_latch.power_target_w(latch, k.min)))
        elif k.kind in (KnobKind.POWER_LIMIT, KnobKind.PL1, KnobKind.PL2):
            targets.append((k, k.min))
        elif k.kind == KnobKind.FAN or (k.kind == KnobKind.PWM and dev.chip
                                        and dev.chip.startswith(GPU_CHIPS)):
            targets.append((k, FULL_PCT))
    if dev.kind == DeviceKind.HWMON and dev.chip and dev.chip.startswith(CPU_CHIPS):
        targets += [(k, package_floor_w(k)) for d in devices if d.kind == DeviceKind.POWERCAP
                    for k in d.knobs if k.kind in (KnobKind.PL1, KnobKind.PL2)]
        targets += [(k, FULL_PCT) for d in devices if d.kind == DeviceKind.HWMON and d.chip
                    and not d.chip.startswith(GPU_CHIPS) for k in d.knobs if k.kind == KnobKind.PWM]
    return targets


def package_floor_w(knob: Knob) -> float:
    """Where a critical CPU temperature cuts a RAPL PL1/PL2 (W): the zone's own minimum, else
    :data:`PACKAGE_FLOOR_W` (under a quarter of its maximum, its default if lower)."""
    if knob.min is not None:
        return knob.min
    floor = min(PACKAGE_FLOOR_W, knob.max / 4) if knob.max else PACKAGE_FLOOR_W
    return min(floor, knob.default) if knob.default else floor


def _stalled(sp: SafetyPlan, fans: Mapping[str, str], fan_sources: Mapping[str, Iterable[str]],
             decisions: dict[str, Decision]) -> None:
    """Full duty for stalled fans (``fans``: knob id → ``kick``, ``stalled`` or ``failed``); a ``failed``
    one's zone as a failed cooler (see the module doc)."""
    for fan_id, action in fans.items():
        knob = sp.knobs.get(fan_id)
        if knob is None:
            continue
        what = "kick-start: a fan under duty reads no speed" if action == "kick" else "stalled fan"
        dec = _decide(knob, FULL_PCT, "stalled-fan", f"{fan_id}: {what}: full duty", {"fan": action})
        if dec is not None:
            decisions.setdefault(fan_id, dec)
        if action != "failed":
            continue
        zone = set(fan_sources.get(fan_id, ()))
        where = ", ".join(sorted(zone)) or "no curve source"
        why = f"{fan_id} stalled: its zone ({where}) is a failed cooler"
        targets = [(sp.knobs[f], FULL_PCT) for f, src in fan_sources.items()
                   if f != fan_id and f in sp.knobs and zone.intersection(src)]
        for dev_id in sorted({ch.rsplit("/", 1)[0] for ch in zone}):
            dev = sp.by_id.get(dev_id)
            if dev is not None:
                targets += _cooling(dev, sp.devices)
        for k, value in targets:
            dec = _decide(k, value, "failed-cooler", why, {"stalled": fan_id})
            if dec is not None:
                decisions.setdefault(k.id, dec)


def _decide(knob: Knob, value: float | None, rule: str, reason: str, inputs: dict) -> Decision | None:
    if value is None:
        return None
    return Decision(knob_id=knob.id, value=knob.clamp(value), layer=Layer.SAFETY, rule=f"safety/{rule}",
                    reason=reason, requested=value, inputs=inputs)


def evaluate(sp: SafetyPlan, readings: Mapping[str, Reading], fan_sources: Mapping[str, Iterable[str]],
             latched: Mapping[str, Latch] | frozenset[str], now: float = 0.0, *,
             fan_failed: Mapping[str, tuple[str, str]] | None = None, fans: Mapping[str, str] | None = None,
             knob_values: Mapping[str, KnobValue] | None = None,
             ) -> tuple[dict[str, Decision], Mapping[str, Latch]]:
    """Safety decisions per knob id and the latches of the critical channels with the release ramps (the
    next call's ``latched``; a plain set, as the fast lane passes, counts as none).

    ``sp``: :func:`plan` of the devices; ``fan_sources``: fan knob id → the temperature channel ids its curve
    may read (from the policies); ``now``: monotonic time (s); ``fan_failed``: fan knob id → (channel,
    status) of the input that failed its source this tick (from the policies' rules); None: every channel in
    ``fan_sources`` must read; ``fans``: knob id → the stall detector's action (``kick``,
    ``stalled``, ``failed``); ``knob_values``: the knobs' values as read this tick (a new latch cuts from the draw,
    never above the power limit in force: :func:`latch_draw_w`)."""
    decisions: dict[str, Decision] = {}
    devices, by_id, knobs = sp.devices, sp.by_id, sp.knobs
    if type(latched) is not MappingProxyType and not isinstance(latched, Mapping):  # the engine's own type
        latched = {}  # first: no ABC check (three Python calls on 3.11) per tick
    ramps = {k[len(RAMP_KEY):]: v for k, v in latched.items() if k.startswith(RAMP_KEY)} if latched else {}
    released: dict[str, tuple[Latch, float]] = {}
    critical, latches = critical_channels(sp, readings, latched, now, released, knob_values)
    fans_of: dict[str, list[str]] = {}
    if critical:
        for fan, sources in fan_sources.items():
            for ch in sources:
                fans_of.setdefault(ch, []).append(fan)

    for ch_id, (value, trig) in critical.items():
        dev = by_id.get(ch_id.rsplit("/", 1)[0])
        if dev is None:
            continue
        latch = latches[ch_id]
        unreadable = math.isnan(value)
        inputs: dict[str, object] = {ch_id: "unreadable" if unreadable else round(value, 2),
                                     "trigger_c": round(trig, 2)}
        if latch.ref_w is not None:
            inputs["latched_draw_w"] = round(latch.ref_w, 1)
        why = (f"{ch_id} at {value:g} °C ≥ {trig:g} °C (threshold − margin)" if value >= trig else
               f"{ch_id} latched at {trig:g} °C and now unreadable: its cut holds" if unreadable else
               f"{ch_id} latched at {trig:g} °C since {latch.since:.0f} s, now {value:g} °C: held until it "
               f"stays {RELEASE_C:g} °C under for {safety_latch.RELEASE_HOLD_S:g} s")
        targets = _critical_targets(dev, devices, latch)
        for i, (k, cut) in enumerate(targets):
            ramp = ramps.get(k.id)
            if ramp is not None and k.kind in POWER_KINDS:  # the ceiling in force did not hold
                ramps[k.id] = safety_ramp.tripped(ramp, latch.since, now)
                targets[i] = (k, None if cut is None else min(cut, ramp.ceiling))  # a cut never raises
        targets += [(knobs[f], FULL_PCT) for f in fans_of.get(ch_id, ()) if f in knobs]
        for knob, value_to in targets:
            dec = _decide(knob, value_to, CRITICAL_RULE[len("safety/"):], why, inputs)
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
    if fans:
        _stalled(sp, fans, fan_sources, decisions)
    if ramps or released:
        _ramps(sp, readings, ramps, released, decisions, now)
        latches.update((RAMP_KEY + kid, r) for kid, r in ramps.items())
    return decisions, MappingProxyType(latches)
