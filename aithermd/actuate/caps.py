"""Requested versus enforced power limits: who capped a GPU below what was asked, and a draw that stays above
what is enforced.

NVML reports two limits (nvml.h): the *requested* management limit (``nvmlDeviceGetPowerManagementLimit``,
what ``nvidia-smi -pl`` and aithermd set) and the *enforced* one (``nvmlDeviceGetEnforcedPowerLimit``): the
lowest of every limit in force — the requested one, nvidia-powerd's Dynamic Boost budget on notebooks, an
out-of-band limit set by the BMC or the board's firmware (GH200 modules, OEM servers). :class:`PowerCaps`
looks at every GPU power limit each tick:

- **Capped**: enforced below requested. One ``drift`` event when it starts or its likely cause changes
  (``why: enforced_below_requested``, ``capped_by``): another tool, when the requested limit is not the one
  aithermd set (nvidia-smi -pl, another daemon); nvidia-powerd when it runs; else an out-of-band limit.
- **Above enforced**: the draw stays more than :data:`OVER_MARGIN` above the enforced limit for
  :data:`OVER_S`: one ``power`` event (``why: draw_above_enforced``, counted by
  ``aithermd_gpu_power_above_limit_total``) and, for a limit aithermd owns, one re-apply of the requested
  limit (the driver may have lost it: a GPU reset, a firmware update). Not again until the draw came back
  under the limit.

:attr:`PowerCaps.state` (knob → ``{"requested_w", "enforced_w", "capped_by", "above_s"}``) is published as
``Snapshot.health["power_limits"]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from aithermd.actuate.applier import tolerance
from aithermd.model import Event, KnobKind, KnobValue, Reading, Status

OVER_S = 30.0  # a draw above the enforced limit for this long is not a transient (the limit loop is ~1 s)
OVER_MARGIN = (5.0, 0.03)  # W, and fraction of the enforced limit: a power sensor's error and a step's spike
POWERD = "nvidia-powerd"


def powerd_running(proc: str = "/proc") -> bool:
    """Whether an ``nvidia-powerd`` process runs (its ``comm``); read only when a cap appears."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm"), encoding="utf-8", errors="replace") as f:
                if f.read().strip() == POWERD:
                    return True
        except OSError:
            continue
    return False


@dataclass
class _Cap:
    by: str | None = None
    above_since: float | None = None
    alerted: bool = False


class PowerCaps:
    """See the module doc. ``powerd()`` tells whether nvidia-powerd runs (default: :func:`powerd_running`)."""

    def __init__(self, powerd: Callable[[], bool] = powerd_running, over_s: float = OVER_S) -> None:
        self.powerd = powerd
        self.over_s = over_s
        self._caps: dict[str, _Cap] = {}
        self.state: dict[str, dict[str, Any]] = {}
        self._log = structlog.get_logger("aithermd.caps")

    def observe(self, world: Any, readings: Mapping[str, Reading], knobs: Mapping[str, KnobValue],
                requested: Mapping[str, float], t_mono: float, t_wall: float) -> tuple[list[Event], set[str]]:
        """This tick's GPU power limits (``knobs``: sampled values with ``extra["enforced_w"]``) and draws
        (``readings``), against what aithermd asked (``requested``: knob → W). Returns the events and the
        knobs to write again (once per episode of a draw above the enforced limit)."""
        events: list[Event] = []
        reapply: set[str] = set()
        state: dict[str, dict[str, Any]] = {}
        for knob_id, knob in world.knobs.items():
            if knob.kind is not KnobKind.POWER_LIMIT:
                continue
            kv = knobs.get(knob_id)
            if kv is None or kv.status is not Status.OK or kv.value is None or "enforced_w" not in kv.extra:
                continue
            cap = self._caps.setdefault(knob_id, _Cap())
            asked, enforced = kv.value, kv.extra["enforced_w"]
            ours = requested.get(knob_id)
            by = None
            if enforced < asked - tolerance(knob, asked):
                by = self._who(asked, ours, knob)
            if by != cap.by:
                events += self._capped(knob_id, knob.device_id, asked, enforced, by, t_wall)
                cap.by = by
            draw = readings.get(f"{knob.device_id}/power")
            watts = draw.value if draw is not None and draw.status is Status.OK else None
            above = watts is not None and watts > enforced + max(OVER_MARGIN[0], OVER_MARGIN[1] * enforced)
            if not above:
                cap.above_since, cap.alerted = None, False
            elif cap.above_since is None:
                cap.above_since = t_mono
            elif not cap.alerted and t_mono - cap.above_since >= self.over_s:
                cap.alerted = True
                events.append(self._above(knob_id, knob.device_id, watts, enforced, t_mono - cap.above_since,
                                          ours is not None, t_wall))
                if ours is not None:
                    reapply.add(knob_id)
            above_s = None if cap.above_since is None else round(t_mono - cap.above_since, 1)
            state[knob_id] = {"requested_w": asked, "enforced_w": enforced, "capped_by": cap.by,
                              "above_s": above_s}
        self.state = state
        return events, reapply

    def _who(self, asked: float, ours: float | None, knob: Any) -> str:
        if ours is not None and abs(asked - ours) > tolerance(knob, ours):
            return "another tool (nvidia-smi -pl, another daemon) set the requested limit"
        if self.powerd():
            return "nvidia-powerd (Dynamic Boost) holds the GPU to its budget"
        return "an out-of-band limit (the BMC or the board's firmware)"

    def _capped(self, knob_id: str, device_id: str, asked: float, enforced: float, by: str | None,
                t_wall: float) -> list[Event]:
        if by is None:
            self._log.info("power_cap_lifted", knob=knob_id, requested_w=asked, enforced_w=enforced)
            return []
        message = f"{knob_id}: enforced limit {enforced:g} W is below the requested {asked:g} W: likely {by}"
        self._log.warning("drift", knob=knob_id, device=device_id, message=message, capped_by=by)
        return [Event("drift", t_wall, knob_id, message, {"device": device_id, "unit": "W", "expected": asked,
                                                         "got": enforced, "why": "enforced_below_requested",
                                                         "capped_by": by})]

    def _above(self, knob_id: str, device_id: str, watts: float, enforced: float, for_s: float, owned: bool,
               t_wall: float) -> Event:
        then = "; writing the requested limit again once" if owned else ""
        message = (f"{knob_id}: {device_id} draws {watts:.0f} W, above its enforced limit {enforced:g} W "
                   f"for {for_s:.0f} s{then}")
        self._log.error("power_above_limit", knob=knob_id, device=device_id, draw_w=watts,
                        enforced_w=enforced, for_s=round(for_s, 1), message=message)
        return Event("power", t_wall, knob_id, message, {"device": device_id, "unit": "W", "draw_w": watts,
                                                         "enforced_w": enforced, "why": "draw_above_enforced",
                                                         "reapplied": owned})
