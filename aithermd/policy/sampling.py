"""Which values the policies' windows need each tick, and pushing them: a list built once per set of plans.

Window keys are channel ids (``gpu0/utilization``, ``hwmon:k10temp-pci-00c3/temp1``) or derived values:
``gpu<N>/power_pct`` (power draw as % of the present power limit, else of the default),
``cpu/package_power`` (sum of the CPU packages' power, W: each package once, never its subzones, psys or
an MMIO copy of it: :func:`aithermd.model.is_cpu_package`) and ``source:FN|INPUTS`` (a fan curve's
source for ``smoothing_s``, resolved as the curve resolves it: :mod:`aithermd.policy.sources`).
A reading that is not ok pushes nothing and leaves its key out of the tick's ``ok`` set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aithermd.model import Status, is_cpu_package
from aithermd.policy import sources
from aithermd.policy.conditions import CPU_KEY
from aithermd.policy.windows import Window

HORIZON_PAD_S = 2.0
READING, POWER_PCT, CPU_POWER, SOURCE = 0, 1, 2, 3
SOURCE_PREFIX = sources.PREFIX
OK = Status.OK


@dataclass(frozen=True)
class Sampler:
    plans: tuple[Any, ...]  # the plans it was built for (compared by identity)
    items: tuple[tuple[str, float, int, Any, Any, Any], ...]  # key, horizon, kind, a, b, c

    def matches(self, plans: Sequence[Any]) -> bool:
        return len(plans) == len(self.plans) and all(a is b for a, b in zip(plans, self.plans, strict=True))


def build(plans: Sequence[Any]) -> Sampler:
    needs: dict[str, float] = {}
    for p in plans:
        for k, h in p.needs.items():
            needs[k] = max(needs.get(k, 0.0), h)
    devices = plans[0].devices if plans else ()
    knobs = plans[0].knobs if plans else {}
    items = []
    for key, horizon in needs.items():
        h = horizon + HORIZON_PAD_S
        if key == CPU_KEY["cpu.power_w"]:
            ids = tuple(f"{d.id}/power" for d in devices if is_cpu_package(d))  # each package once
            items.append((key, h, CPU_POWER, ids, None, None))
        elif key.startswith(SOURCE_PREFIX):
            fn, inputs = sources.parse_key(key)
            items.append((key, h, SOURCE, inputs, fn, None))
        elif key.endswith("/power_pct"):
            dev = key.rsplit("/", 1)[0]
            knob = knobs.get(f"{dev}/power_limit")
            items.append((key, h, POWER_PCT, f"{dev}/power", f"{dev}/power_limit",
                          knob.default if knob is not None else None))
        else:
            items.append((key, h, READING, key, None, None))
    return Sampler(tuple(plans), tuple(items))


def _ok(r: Any) -> float | None:
    if r is None or r.status is not OK:
        return None
    v = r.value
    return None if v is None or v != v else float(v)


def update(sampler: Sampler, t: float, readings: Mapping[str, Any], knob_values: Mapping[str, Any],
           prev: Mapping[str, Window]) -> tuple[dict[str, Window], set[str]]:
    """New windows (every needed key) and the keys that got a fresh ok value at time ``t``."""
    out: dict[str, Window] = {}
    ok: set[str] = set()
    get = readings.get
    for key, horizon, kind, a, b, c in sampler.items:
        if kind == READING:  # _ok() inline: the usual item
            r = get(a)
            v = None if r is None or r.status is not OK or (v := r.value) is None or v != v else float(v)
        elif kind == POWER_PCT:
            v = _ok(get(a))
            if v is not None:
                kv = knob_values.get(b)
                limit = kv.value if kv is not None and kv.status is OK and kv.value else c
                v = 100.0 * v / limit if limit else None
        elif kind == SOURCE:
            v = sources.resolve(b, a, readings).value
        else:
            parts = [_ok(get(i)) for i in a]
            v = None if not parts or None in parts else sum(parts)  # type: ignore[arg-type]
        w = prev.get(key)
        if w is None:
            w = Window()
        if v is not None:
            w = w.push(t, v, horizon)
            ok.add(key)
        out[key] = w
    return out, ok
