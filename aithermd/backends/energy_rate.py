"""Energy counters that jump: the largest increase a device's energy counter can plausibly make.

An increase of an energy counter over an interval implies a mean power. Above anything the device can draw
it is no measure but a bad sample: a 64-bit value read half-updated, a counter re-based *ahead* after a GPU
reset or driver reload, a RAPL ``energy_uj`` reset read as a wrap. One such sample (NVML's total energy
+ 2**40 mJ, once: 1.1e9 J "in a second" on a 600 W card) otherwise stays in every total for good.

The ceiling (:func:`ceiling_w`): :data:`POWER_MARGIN` × a GPU's maximum power limit where it states one (NVML
``nvmlDeviceGetPowerManagementLimitConstraints`` max; the board's power capping holds that limit averaged over
well under a second, its excursions above it last milliseconds, so twice the limit over a second or more is
never a real draw), else the absolute :data:`MAX_PLAUSIBLE_W` (no single GPU, CPU package or RAPL zone draws 5
kW). The interval counts as at least :data:`MIN_GAP_S`: two reads close together may see a counter's update
granularity, not a rate.

:class:`CounterGuard` applies it to energy readings (J) as a backend produces them: a reading whose increase
over the last good one is implausible becomes ``implausible`` (logged once per episode), and the next good
reading covers the gap with the counter's own increase -- nothing is estimated and nothing lost. A counter
that stays ahead (re-based: :data:`REBASE_READS` implausible reads in a row whose increases *among
themselves* are plausible) is re-anchored: the interval up to the first bad read is estimated from the
device's power × time, as the accounting does for a counter that went back, and the reported counter goes
on from there -- it never jumps by the garbage. A counter that goes backwards passes through as it is (the
accounting's reset handling, :mod:`aithermd.accounting.meter`). Shared by RAPL
(:mod:`aithermd.backends.powercap_energy`), NVML and the accounting's meter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass

import structlog

from aithermd.model import Device, KnobKind, Quantity, Reading, Status

# W: above this no device draws (a 2-socket server package, a single GPU board: well under 2 kW)
MAX_PLAUSIBLE_W = 5000.0
# × the device's maximum power limit: the most its counter may imply over MIN_GAP_S or more
POWER_MARGIN = 2.0
# s: the shortest interval a rate is judged over
MIN_GAP_S = 1.0
# implausible reads in a row, plausible among themselves, that make a counter re-based ahead
REBASE_READS = 2

_log = structlog.get_logger("aithermd.energy")


@dataclass(frozen=True, slots=True)
class CounterReading(Reading):
    """An energy reading (``value``: the backend's running total, J) that also gives the wrapping counter
    it was counted from, for the accounting across a daemon restart (:mod:`aithermd.accounting.meter`):
    ``counter_j`` the counter's raw value (J) at the read the total counts up to, ``modulus_j`` where it
    wraps (J: RAPL ``max_energy_range_uj`` + 1 µJ), ``max_gap_s`` the longest interval (s) it can measure
    (the range at the zone's highest power: longer, it may have wrapped more than once). Equal to no plain
    :class:`~aithermd.model.Reading`; whatever reads ``value``/``status``/``detail`` sees no difference."""

    counter_j: float | None = None
    modulus_j: float | None = None
    max_gap_s: float | None = None


def ceiling_w(max_limit_w: float | None) -> float:
    """The highest mean power (W) a device whose maximum power limit is ``max_limit_w`` (W; None or ≤ 0:
    unknown) can draw: :data:`POWER_MARGIN` × that limit, else :data:`MAX_PLAUSIBLE_W`."""
    if max_limit_w is None or not max_limit_w > 0:
        return MAX_PLAUSIBLE_W
    return min(POWER_MARGIN * max_limit_w, MAX_PLAUSIBLE_W)


def device_ceiling_w(device: Device) -> float:
    """:func:`ceiling_w` of ``device``: from the highest ``max`` (W) of its GPU power-limit knobs, if it has
    any. Not from RAPL PL1/PL2: their maximum (``constraint_N_max_power_uw``, about the TDP) bounds no draw
    (PL2 and a board's "unlimited" firmware limits let a package draw more for minutes; a package over 2 ×
    TDP lost a third of its energy as garbage, attack5 C8): a zone keeps :data:`MAX_PLAUSIBLE_W`."""
    limits = [k.max for k in device.knobs if k.kind in _LIMITS and k.max is not None and k.max > 0]
    return ceiling_w(max(limits) if limits else None)


_LIMITS = frozenset({KnobKind.POWER_LIMIT})  # held by the board over well under a second (module doc)


def implausible_w(delta_j: float, dt_s: float, ceiling: float, min_gap_s: float = MIN_GAP_S) -> float | None:
    """The mean power (W) that an increase of ``delta_j`` J over ``dt_s`` s implies, when it exceeds
    ``ceiling`` W (the interval counted as at least ``min_gap_s``); None when it is plausible (or not an
    increase)."""
    if delta_j <= 0:
        return None
    gap = dt_s if dt_s > min_gap_s else min_gap_s
    watts = delta_j / gap if gap > 0 else float("inf")
    return watts if watts > ceiling else None


class CounterGuard:
    """Per energy channel: the last good counter value, the offset of a re-based counter and the bad reads
    in a row. :meth:`check` once per sample with the backend's readings."""

    def __init__(self) -> None:
        # channel id → [last good raw J, its boot-clock s, offset J, (raw J, s) of the bad reads in a row]
        self._state: dict[str, list] = {}
        self.implausible = 0  # bad samples seen (one per reading made implausible)
        self._devices: tuple[Device, ...] | None = None
        self._ceilings: dict[str, float] = {}
        self._power: dict[str, str] = {}  # energy channel id → its device's power channel id

    def check_devices(self, readings: MutableMapping[str, Reading], t: float,
                      devices: Iterable[Device]) -> None:
        """:meth:`check` for the measured (not estimated) energy channels of ``devices``, each against
        :func:`device_ceiling_w`, a re-based interval estimated from the device's power channel."""
        devices = tuple(devices)
        if self._devices is None or len(devices) != len(self._devices) or \
                any(a is not b for a, b in zip(devices, self._devices, strict=True)):
            self._devices = devices
            self._ceilings = {c.id: device_ceiling_w(d) for d in devices for c in d.channels
                              if c.quantity is Quantity.ENERGY and not c.estimated}
            self._power = {c.id: p.id for d in devices for c in d.channels
                           if c.quantity is Quantity.ENERGY
                           for p in d.channels if p.quantity is Quantity.POWER}
            self.forget(set(self._ceilings))
        power = None
        if self._state and any(st[3] for st in self._state.values()):  # a bad read pending: its power
            power = {cid: r.value if (r := readings.get(pid)) is not None and r.status is Status.OK else None
                     for cid, pid in self._power.items()}
        self.check(readings, t, self._ceilings, power)

    def check(self, readings: MutableMapping[str, Reading], t: float,
              ceilings: Mapping[str, float], power: Mapping[str, float | None] | None = None) -> None:
        """Judge the ok readings of the energy channels in ``ceilings`` ({channel id: W ceiling}) read at
        boot-clock time ``t`` (s, CLOCK_BOOTTIME: it counts a suspend, in which
        the counter runs on): replaced in ``readings`` by an ``implausible`` one, or by the re-anchored
        value of a re-based counter. ``power``: {channel id: the device's power now (W)} for the estimate
        of a re-based counter's interval."""
        state = self._state
        for cid, ceiling in ceilings.items():
            r = readings.get(cid)
            if r is None or r.status is not Status.OK or r.value is None:
                continue
            raw = r.value
            st = state.get(cid)
            if st is None:
                state[cid] = [raw, t, 0.0, []]
                continue
            last, last_t, offset, bad = st
            if raw < last:  # went back (a reset): as it is, for the accounting's reset handling
                state[cid] = [raw, t, 0.0, []]
                continue
            watts = implausible_w(raw - last, t - last_t, ceiling)
            if watts is None:
                st[0], st[1], st[3] = raw, t, []
                if offset:
                    readings[cid] = Reading(cid, raw - offset, r.status, r.detail)
                continue
            if bad and implausible_w(raw - bad[-1][0], t - bad[-1][1], ceiling) is None \
                    and raw >= bad[-1][0] and len(bad) + 1 >= REBASE_READS:
                first_raw, first_t = bad[0]
                p = (power or {}).get(cid)
                estimate = min(max(p or 0.0, 0.0), ceiling) * max(0.0, first_t - last_t)
                # reported = last reported + estimate + the counter's own increase since its first bad read
                st[2] = offset = (first_raw - (last - offset)) - estimate
                st[0], st[1], st[3] = raw, t, []
                _log.warning("energy_counter_rebased", channel=cid, jump_j=first_raw - last,
                             estimated_j=round(estimate, 3))
                readings[cid] = Reading(cid, raw - offset, r.status, r.detail)
                continue
            if not bad:
                _log.warning("energy_counter_implausible", channel=cid, increase_j=raw - last,
                             implied_w=round(watts), ceiling_w=round(ceiling))
            bad.append((raw, t))
            del bad[:-REBASE_READS]
            self.implausible += 1
            readings[cid] = Reading(cid, None, Status.IMPLAUSIBLE,
                                    f"{raw - last:.6g} J in {t - last_t:.3g} s = {watts:.3g} W, over the "
                                    f"{ceiling:.0f} W this device can draw: a bad sample, not counted")

    def forget(self, keep: set[str]) -> None:
        """Drop the state of channels not in ``keep`` (a GPU gone or re-probed)."""
        for cid in [c for c in self._state if c not in keep]:
            del self._state[cid]
