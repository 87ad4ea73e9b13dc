"""RAPL ``energy_uj`` counters → energy and power readings (Documentation/power/powercap/powercap.rst).

``energy`` (J) is a monotonic total that starts at the counter's first value and adds each wrap-corrected
increase; ``power`` (W) is the increase over the *measured* interval between two samples (the first sample
has no power: status ``stale``). When the counter goes backwards it wrapped: the increase is
``new + max_energy_range_uj − old``. An interval longer than the counter can represent
(``max_energy_range_uj`` at the zone's highest power: it may have wrapped more than once, after a suspend or
a stalled daemon) is discarded (power ``stale``, nothing added), never reported as a tiny power.

Sleep: the monotonic clock stops while the machine is suspended, the counter may not (s2idle keeps the
package counting; clock_gettime(2): only CLOCK_BOOTTIME "includes any time that the system is suspended").
So the interval is measured on the boot clock, and an interval the machine slept in has no power (``stale``:
the package drew at two very different rates in it) while its energy still counts, unless the counter went
back (a reset with the package in S3 is as likely as a wrap: nothing is counted). Measured on the
monotonic clock, 120 J drawn in an s2idle sleep read as one 119 W sample on a 50 W package, and an hour's
sleep as an "implausible" reset whose energy was dropped.

A read that implies more than twice the zone's highest constraint power *and* more than twice its last
measured power is held one read (power ``stale``, energy not yet counted): the next read, measured from the
last good one, says it all -- one bad ``energy_uj`` read (+4 kJ on a 50 W package, then back: attack8 T3,
which the 5 kW bound let through) is never counted, a real surge (PL2, an "unlimited" board: attack5 C8) is
counted in full one read late, and from then on is the zone's own rate.
"""

from __future__ import annotations

from aithermd import units
from aithermd.backends.energy_rate import MAX_PLAUSIBLE_W, implausible_w  # noqa: F401 - API
from aithermd.backends.powercap_zones import max_gap_s
from aithermd.backends.sysfs import Attribute
from aithermd.model import Reading, Status

# MAX_PLAUSIBLE_W (W): above it a zone's power is nonsense; one ceiling with NVML and the accounting
# (aithermd.backends.energy_rate)
# boot-clock time beyond monotonic time in one interval that means the machine slept in it (a busy host
# lets the two drift apart by microseconds, never by a second)
SLEPT_S = 1.0


class _Zone:
    __slots__ = ("device_id", "energy", "why_not", "max_range", "max_gap_s", "prev_raw", "prev_t",
                 "prev_boot", "total_uj", "suspect_w", "rate_w", "held")

    def __init__(self, device_id: str, energy: Attribute, why_not: str | None, max_range: int | None,
                 max_gap: float | None = None, suspect_w: float | None = None) -> None:
        self.device_id, self.energy, self.why_not, self.max_range = device_id, energy, why_not, max_range
        self.max_gap_s = max_gap if max_gap is not None else max_gap_s(max_range, None)
        self.suspect_w = suspect_w  # W: 2 × the zone's highest constraint power (None: no limit stated)
        self.rate_w = 0.0  # W: the last measured power
        self.held = False  # the last read was held (see the module doc): the next one is measured as it is
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
            Reading(energy_id, units.uj_to_j(raw)),
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
    elif not zone.held and zone.suspect_w is not None and \
            (watts := units.uj_to_j(delta) / dt) > max(zone.suspect_w, 2.0 * zone.rate_w):
        zone.held = True  # the previous read stays the reference: the next one is measured from it
        return (Reading(power_id, None, Status.STALE, f"{watts:.0f} W, over twice the zone's limits and its "
                        f"last {zone.rate_w:.0f} W: held until the next read"),
                Reading(energy_id, units.uj_to_j(zone.total_uj)))
    else:
        power = Reading(power_id, units.uj_to_j(delta) / dt)
        zone.rate_w = power.value
    zone.held = False
    zone.prev_raw, zone.prev_t, zone.prev_boot = raw, t, boot
    zone.total_uj += delta
    return power, Reading(energy_id, units.uj_to_j(zone.total_uj))
