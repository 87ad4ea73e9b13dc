"""Replay: the real engine over a recorded nvidia-smi trace, on GPUs described by ``nvidia-smi -q`` dumps.

Each trace GPU becomes ``gpu<N>`` (N = its order in the trace) with the profile's limits and thresholds; its
power limit starts at the profile's current limit. Every sample is one engine tick. A knob the policy stops
deciding goes back to where it started (as the daemon hands it back). Energy integrates the trace's power
over time (each sample's power covers the interval since the previous sample, except across a gap: an
interval longer than :func:`aithermd.policy.trace.gap_s`, where the logger stopped, is reported and left out
of every total, since nothing is known of it); ``energy_above_limit_j`` is
the part above the limit the policy had set for that interval — what capping would have cut; ``stale_s`` the
time a GPU repeated identical samples (a stuck logger).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, KnobValue, Quantity, Reading, Status
from aithermd.policy.engine import EngineInput, evaluate, initial_state
from aithermd.policy.trace import Trace, gap_s
from aithermd.sim.gpu_profile import GpuProfile

FIELD_CHANNEL = MappingProxyType({  # trace field → (channel attribute, quantity, unit)
    "temperature.gpu": ("temperature", Quantity.TEMPERATURE, "°C"),
    "temperature.memory": ("memory_temperature", Quantity.TEMPERATURE, "°C"),
    "utilization.gpu": ("utilization", Quantity.UTILIZATION, "%"),
    "utilization.memory": ("memory_utilization", Quantity.UTILIZATION, "%"),
    "power.draw": ("power", Quantity.POWER, "W"),
    "clocks.sm": ("sm_clock", Quantity.CLOCK, "MHz"),
    "clocks.mem": ("memory_clock", Quantity.CLOCK, "MHz"),
})
CHANGE_EPS = 1e-6
# what the efficient search's signals need from a trace (efficient.read_signal): progress, GPM activity and
# a locked-clock search's signals cannot come from nvidia-smi --query-gpu; these can
SIGNAL_FIELDS = (("utilization.gpu", "clocks.sm"), ("utilization.memory",))

def gpu_device(index: int, profile: GpuProfile, fields: Sequence[str]) -> Device:
    """``gpu<index>`` as the NVML backend would describe it, from a profile and the trace's fields."""
    dev = f"gpu{index}"
    channels = []
    for f, (attr, qty, unit) in FIELD_CHANNEL.items():
        if f not in fields and attr not in ("temperature", "power", "utilization"):
            continue
        thresholds: dict[str, float] = {}
        if attr == "temperature":
            for key, value in (("slowdown", profile.slowdown_temp_c), ("shutdown", profile.shutdown_temp_c),
                               ("max_operating", profile.max_operating_temp_c)):
                if value is not None:
                    thresholds[key] = value
        elif attr == "memory_temperature" and profile.memory_max_temp_c is not None:
            thresholds["max_operating"] = profile.memory_max_temp_c
        channels.append(Channel(f"{dev}/{attr}", dev, attr, qty, unit, thresholds=thresholds))
    knobs = [Knob(f"{dev}/power_limit", dev, KnobKind.POWER_LIMIT, "W", profile.min_power_limit_w,
                  profile.max_power_limit_w, profile.default_power_limit_w, writable=True)]
    knobs += [Knob(f"{dev}/fan{j}", dev, KnobKind.FAN, "%", 0.0, 100.0, None, writable=True)
              for j in range(len(profile.fan_speeds_pct))]
    return Device(dev, DeviceKind.GPU, profile.name, tuple(channels), tuple(knobs),
                  info={"uuid": profile.uuid or f"GPU-replay-{index}", "pci_bus_id": profile.pci_bus_id})


def start_values(profile: GpuProfile, device: Device) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"{device.id}/power_limit": profile.power_limit_w}
    for j, pct in enumerate(profile.fan_speeds_pct):
        out[f"{device.id}/fan{j}"] = pct
    return out


@dataclass
class GpuTotals:
    limit_changes: int = 0
    time_in_state_s: dict[str, float] = field(default_factory=dict)
    energy_j: float = 0.0
    limit_time_w_s: float = 0.0
    limit_time_s: float = 0.0
    energy_above_limit_j: float = 0.0
    stale_s: float = 0.0
    searched: bool = False  # an efficient search ran on one of its knobs

    def as_dict(self) -> dict[str, Any]:
        mean = self.limit_time_w_s / self.limit_time_s if self.limit_time_s > 0 else None
        return {"limit_changes": self.limit_changes, "searched": self.searched,
                "time_in_state_s": {k: round(v, 3) for k, v in self.time_in_state_s.items()},
                "energy_j": round(self.energy_j, 3),
                "mean_power_limit_w": None if mean is None else round(mean, 3),
                "energy_above_limit_j": round(self.energy_above_limit_j, 3),
                "stale_s": round(self.stale_s, 3)}


def _readings(trace: Trace, sample: Any, devices: Sequence[Device]) -> dict[str, Reading]:
    out: dict[str, Reading] = {}
    for i, row in enumerate(sample.gpus):
        dev = devices[i].id
        for f, (attr, _q, _u) in FIELD_CHANNEL.items():
            if f not in trace.fields:
                continue
            cid = f"{dev}/{attr}"
            if row is None:
                out[cid] = Reading(cid, None, Status.STALE, "no row for this GPU in this sample")
                continue
            v = row.values.get(f)
            if v is None:
                status = Status.FAILED if f in row.failed else Status.NOT_SUPPORTED
                out[cid] = Reading(cid, None, status, "trace says N/A")
            else:
                out[cid] = Reading(cid, v)
    return out


def replay(trace: Trace, profiles: Sequence[GpuProfile], policy: Any) -> dict[str, Any]:
    """Run ``policy`` over ``trace`` with ``profiles[i]`` for trace GPU i. Returns the ``--json`` document:
    ``{"decisions": [{"t", "device", "knob", "old", "new", "rule", "reason"}], "summary": {"duration_s",
    "gpus": {id: {"limit_changes", "searched", "time_in_state_s", "energy_j", "mean_power_limit_w",
    "energy_above_limit_j", "stale_s"}}, "no_search" (only when the policy searches and a GPU was never
    searched: why)}}``.

    The trace plays as recorded: a limit the policy sets does not change what the trace drew, so an
    efficient-limit search here shows its steps and their timing against the recorded signal, not how a
    job answers a cap (``aithermd run --simulate --trace`` does that, on the calibrated card).

    A gap (:func:`aithermd.policy.trace.gaps`) is listed in ``summary["gaps"]`` as
    ``{"after_line", "line", "seconds"}`` and its time is in no total: ``duration_s`` is the recorded time,
    the sum of the intervals that are not gaps (the engine still sees the samples' own times)."""
    devices = tuple(gpu_device(i, p, trace.fields) for i, p in enumerate(profiles))
    start: dict[str, float | None] = {}
    for p, d in zip(profiles, devices, strict=True):
        start.update(start_values(p, d))
    current = dict(start)
    totals = [GpuTotals() for _ in devices]
    decisions: list[dict[str, Any]] = []
    state = initial_state()
    prev_states: dict[str, str] = {}
    prev_t: float | None = None
    prev_rows: list[Any] = [None] * len(devices)
    longest, gaps, recorded_s, prev_line = gap_s(trace.period_s), [], 0.0, 0
    for sample in trace.samples:
        readings = _readings(trace, sample, devices)
        if prev_t is not None and sample.t - prev_t > longest:
            gaps.append({"after_line": prev_line, "line": sample.line,
                         "seconds": round(sample.t - prev_t, 3)})
        elif prev_t is not None:
            dt = sample.t - prev_t
            recorded_s += max(0.0, dt)
            for i, d in enumerate(devices):
                _account(totals[i], sample.gpus[i], prev_rows[i], dt, current.get(f"{d.id}/power_limit"),
                         prev_states.get(d.id))
        knobs = {k: KnobValue(k, v) for k, v in current.items()}
        inp = EngineInput(t_mono=sample.t, t_wall=sample.t_wall, devices=devices, readings=readings,
                          knobs=knobs)
        result = evaluate(policy, (), inp, state)
        state = result.state
        for ps in state.policies.values():
            for key in ps.searches:  # "rule|gpuN/knob"
                totals[int(key.split("|", 1)[1].split("/", 1)[0][3:])].searched = True
        prev_states = dict(result.states.get(policy.name, {}))
        for knob_id, old in list(current.items()):
            dec = result.decisions.get(knob_id)
            new, rule = (dec.value, dec.rule) if dec is not None else (start[knob_id], "default")
            if new is None or (old is not None and abs(new - old) <= CHANGE_EPS):
                continue
            current[knob_id] = new
            dev, knob = knob_id.split("/", 1)
            decisions.append({"t": round(sample.t, 3), "device": dev, "knob": knob, "old": old, "new": new,
                              "rule": rule, "reason": dec.reason if dec is not None else ""})
            if knob == "power_limit":
                totals[int(dev[3:])].limit_changes += 1
        prev_t, prev_line = sample.t, sample.line
        prev_rows = list(sample.gpus)
    summary: dict[str, Any] = {"duration_s": round(recorded_s, 3),
                               "gpus": {d.id: t.as_dict() for d, t in zip(devices, totals, strict=True)}}
    if gaps:
        summary["gaps"] = gaps
    if _searches(policy) and not all(t.searched for t in totals):
        missing = [f for f in SIGNAL_FIELDS[0] if f not in trace.fields]
        summary["no_search"] = (f"the trace has no {' or '.join(missing)} column: the efficient search's "
                                "signal (utilization × SM clock) cannot be read, so it does not run"
                                if missing else "no GPU was busy long enough for the efficient search to start")
    return {"decisions": decisions, "summary": summary}


def _searches(policy: Any) -> bool:
    """Whether ``policy`` has a rule with ``limit: efficient`` (or an efficient clock search)."""
    doc = getattr(policy, "document", None)
    return any("efficient" in (getattr(r, "limit", None), getattr(r, "max_mhz", None))
               for r in getattr(doc, "rules", ()) or ())


def _account(tot: GpuTotals, row: Any, prev_row: Any, dt: float, limit: float | None,
             state: str | None) -> None:
    if dt <= 0:
        return
    if state is not None:
        tot.time_in_state_s[state] = tot.time_in_state_s.get(state, 0.0) + dt
    if limit is not None:
        tot.limit_time_w_s += limit * dt
        tot.limit_time_s += dt
    if row is None:
        return
    power = row.values.get("power.draw")
    if power is not None:
        tot.energy_j += power * dt
        if limit is not None and power > limit:
            tot.energy_above_limit_j += (power - limit) * dt
    if prev_row is not None and row.values == prev_row.values and row.text == prev_row.text:
        tot.stale_s += dt
