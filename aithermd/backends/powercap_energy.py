"""RAPL ``energy_uj`` counters → energy and power readings (Documentation/power/powercap/powercap.rst).

``energy`` (J) is a monotonic total that starts at the counter's first value and adds each wrap-corrected
increase; ``power`` (W) is the increase over the *measured* interval between two samples (the first sample
has no power: status ``stale``). When the counter goes backwards it wrapped: the increase is
``new + max_energy_range_uj − old``. An interval longer than the counter can represent
(``max_energy_range_uj`` at the zone's highest power: it may have wrapped more than once, after a suspend or
a stalled daemon) is discarded (power ``stale``, nothing added), never reported as a tiny power. The energy
reading (a :class:`~aithermd.backends.energy_rate.CounterReading`) also gives the raw counter of the last
counted read, where it wraps and that longest interval, for the accounting across a daemon restart.

Sleep: the monotonic clock stops while the machine is suspended, the counter may not (s2idle keeps the
package counting; clock_gettime(2): only CLOCK_BOOTTIME "includes any time that the system is suspended").
So the interval is measured on the boot clock, and an interval the machine slept in has no power (``stale``:
the package drew at two very different rates in it) while its energy still counts, unless the counter went
back (a reset with the package in S3 is as likely as a wrap: nothing is counted). Measured on the
monotonic clock, 120 J drawn in an s2idle sleep read as one 119 W sample on a 50 W package, and an hour's
sleep as an "implausible" reset whose energy was dropped.

A read that implies more than twice the zone's highest constraint power *and* more than twice its last
measured power (the bar) is held (power ``stale``, energy not yet counted), and so is every next read while
the increase from the last good read still implies a rate over the bar (attack9 N4: a hold one read deep
counted a two-read glitch or a step in full, +3.95 kJ, and published 2 050 W as an ``ok`` power of a 95 W
zone). It ends when
- the increase from the last good read falls under the bar: the glitch went away; that increase is counted,
  its mean power published, and no rate learnt from it (attack8 T3: +4 kJ on one read, then back);
- two consecutive intervals after it agree on a rate over the bar: a real surge (PL2, an "unlimited" board:
  attack5 C8), counted in full, two reads late, and from then on the zone's own rate;
- two consecutive intervals after it are under the bar: the counter stepped and runs on from the new base;
  the step is never confirmed, so the intervals up to the step are counted at the last measured rate × their
  time (what the accounting's meter substitutes for a bad sample, :mod:`aithermd.accounting.meter`), those
  after it as measured;
- :data:`HOLD_READS` reads were held with none of these: the whole time since the last good read is counted
  at the last measured rate, and the counter goes on from the read now.
A rate is learnt only from two consecutive reads, never from an interval that spans held reads.
"""

from __future__ import annotations

from itertools import pairwise

from aithermd import units
from aithermd.backends.energy_rate import MAX_PLAUSIBLE_W, CounterReading, implausible_w  # noqa: F401 - API
from aithermd.backends.powercap_zones import max_gap_s
from aithermd.backends.sysfs import Attribute
from aithermd.model import Reading, Status

# MAX_PLAUSIBLE_W (W): above it a zone's power is nonsense; one ceiling with NVML and the accounting
# (aithermd.backends.energy_rate)
# boot-clock time beyond monotonic time in one interval that means the machine slept in it (a busy host
# lets the two drift apart by microseconds, never by a second)
SLEPT_S = 1.0
# reads held at most before the jump is given up as unconfirmed (see the module doc)
HOLD_READS = 4
# two rates over the bar "agree" (a real surge) within this factor of each other
AGREE = 2.0


class _Zone:
    __slots__ = ("device_id", "energy", "why_not", "max_range", "max_gap_s", "prev_raw", "prev_t",
                 "prev_boot", "total_uj", "suspect_w", "rate_w", "held")

    def __init__(self, device_id: str, energy: Attribute, why_not: str | None, max_range: int | None,
                 max_gap: float | None = None, suspect_w: float | None = None) -> None:
        self.device_id, self.energy, self.why_not, self.max_range = device_id, energy, why_not, max_range
        self.max_gap_s = max_gap if max_gap is not None else max_gap_s(max_range, None)
        self.suspect_w = suspect_w  # W: 2 × the zone's highest constraint power (None: no limit stated)
        self.rate_w = 0.0  # W: the last measured power
        # (raw µJ, monotonic s, boot-clock s) of each read held since the last good one (see the module doc)
        self.held: list[tuple[int, float, float]] = []
        self.prev_raw: int | None = None
        self.prev_t = self.prev_boot = 0.0
        self.total_uj = 0


def energy_increase_uj(old: int, new: int, max_range_uj: int | None) -> int | None:
    """µJ consumed between two ``energy_uj`` reads; across a wrap ``new + max_range − old``; None when the
    counter went backwards and the range is unknown."""
    if new >= old:
        return new - old
    if not max_range_uj or max_range_uj <= 0:
        return None
    return new + max_range_uj - old


def account(zone: _Zone, raw: int, t: float, boot: float) -> tuple[Reading, Reading]:
    """The (power, energy) readings of ``zone`` for counter value ``raw`` (µJ) read at monotonic ``t`` and
    boot-clock ``boot`` (s); updates the zone's running state."""
    power_id, energy_id = f"{zone.device_id}/power", f"{zone.device_id}/energy"
    if zone.prev_raw is None:
        zone.prev_raw, zone.prev_t, zone.prev_boot, zone.total_uj = raw, t, boot, raw
        return (
            Reading(power_id, None, Status.STALE, "first energy read: power needs two"),
            _energy(zone, energy_id),
        )
    delta = energy_increase_uj(zone.prev_raw, raw, zone.max_range)
    awake = t - zone.prev_t
    dt = max(awake, boot - zone.prev_boot)
    if zone.max_gap_s is not None and dt > zone.max_gap_s:
        # the counter may have wrapped more than once: whatever it says now is no measure of this gap
        power = Reading(power_id, None, Status.STALE,
                        f"{dt:.0f} s since the last read: longer than energy_uj can represent "
                        f"({zone.max_gap_s:.0f} s); discarded")
        delta = 0
    elif delta is None:
        power = Reading(power_id, None, Status.IMPLAUSIBLE,
                        "energy_uj went backwards and max_energy_range_uj is unknown")
        delta = 0
    elif dt <= 0:
        power = Reading(power_id, None, Status.STALE, "no time passed since the last energy read")
    elif dt - awake > SLEPT_S and raw < zone.prev_raw:
        # backwards across a sleep: a wrap, or the counter reset with the package (S3): no telling which
        power = Reading(power_id, None, Status.STALE, f"the machine slept {dt - awake:.0f} s and energy_uj "
                        "went back: a reset or a wrap, not counted")
        delta = 0
    elif (watts := implausible_w(units.uj_to_j(delta), dt, MAX_PLAUSIBLE_W, 0.0)) is not None:
        # a counter reset (resume, firmware) read as a wrap: no such power exists; count nothing
        power = Reading(power_id, None, Status.IMPLAUSIBLE, f"{watts:.0f} W: energy_uj reset, not a wrap")
        delta = 0
    elif dt - awake > SLEPT_S:
        power = Reading(power_id, None, Status.STALE, f"the machine slept {dt - awake:.0f} s in this "
                        "interval: its energy counts, no power for it")
    elif zone.suspect_w is not None and \
            (watts := units.uj_to_j(delta) / dt) > (bar := max(zone.suspect_w, 2.0 * zone.rate_w)):
        ended = _end_hold(zone, raw, t, boot, bar, power_id)
        if ended is None:  # the last good read stays the reference: the next one is measured from it
            zone.held.append((raw, t, boot))
            return (Reading(power_id, None, Status.STALE, f"{watts:.0f} W since the last good read, over "
                            f"twice the zone's limits and its last {zone.rate_w:.0f} W: held "
                            f"({len(zone.held)} read(s))"), _energy(zone, energy_id))
        power, delta = ended
    else:
        power = Reading(power_id, units.uj_to_j(delta) / dt)
        if not zone.held:  # after a hold the interval spans the held reads: no rate is learnt from it
            zone.rate_w = power.value
    zone.held = []
    zone.prev_raw, zone.prev_t, zone.prev_boot = raw, t, boot
    zone.total_uj += delta
    return power, _energy(zone, energy_id)


def _energy(zone: _Zone, energy_id: str) -> Reading:
    """The energy reading of ``zone`` (its total, J), with the raw counter of the read that total counts up
    to (the last counted one: a held read is not) and where it wraps, when its range is known."""
    total = units.uj_to_j(zone.total_uj)
    if not zone.max_range or zone.max_range <= 0 or zone.prev_raw is None:
        return Reading(energy_id, total)
    return CounterReading(energy_id, total, counter_j=units.uj_to_j(zone.prev_raw),
                          modulus_j=units.uj_to_j(zone.max_range + 1), max_gap_s=zone.max_gap_s)


def _end_hold(zone: _Zone, raw: int, t: float, boot: float, bar: float,
              power_id: str) -> tuple[Reading, int] | None:
    """How a hold ends at counter value ``raw`` (µJ) read at ``t``/``boot`` (s), whose increase from the last
    good read is over ``bar`` (W): (power, µJ to count since the last good read), or None to hold it too (the
    module doc's rules: a surge, a step, or :data:`HOLD_READS` reads unconfirmed)."""
    chain = [(zone.prev_raw or 0, zone.prev_t, zone.prev_boot), *zone.held, (raw, t, boot)]
    rates: list[float | None] = []  # W of the last two intervals (None: went back unknown, or no time)
    for (r0, t0, b0), (r1, t1, b1) in pairwise(chain[-3:]):
        d, gap = energy_increase_uj(r0, r1, zone.max_range), max(t1 - t0, b1 - b0)
        rates.append(None if d is None or gap <= 0 else units.uj_to_j(d) / gap)
    a, b = rates if len(rates) == 2 else (None, None)
    if a is not None and b is not None and min(a, b) > bar and max(a, b) <= AGREE * min(a, b):
        zone.rate_w = b  # a real surge: every increase since the last good read counts
        return Reading(power_id, b), energy_increase_uj(chain[0][0], raw, zone.max_range) or 0
    if a is not None and b is not None and 0 <= a <= bar and 0 <= b <= bar:
        # a step: the counter runs on from the read before these two; up to it, the last measured rate
        (r0, t0, b0), (r1, t1, b1) = chain[0], chain[-3]
        before = round(zone.rate_w * max(t1 - t0, b1 - b0) * 1e6)
        zone.rate_w = b
        return Reading(power_id, b), before + (energy_increase_uj(r1, raw, zone.max_range) or 0)
    if len(zone.held) < HOLD_READS:
        return None
    (r0, t0, b0) = chain[0]
    return (Reading(power_id, None, Status.STALE, f"a jump of energy_uj not confirmed in {HOLD_READS} reads: "
                    f"counted at the last measured {zone.rate_w:.0f} W"),
            round(zone.rate_w * max(t - t0, boot - b0) * 1e6))
