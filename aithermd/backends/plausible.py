"""What a sensor can physically report: the ranges, sentinels and rates a reading is checked against.

Three checks, each with its source:

- **Range per quantity** (every hwmon channel): temperature −100…200 °C (catches −273 °C "0 K", 255 °C
  all-ones, millions of °C), fan 0…50 000 RPM (65 535 is an all-ones 16-bit tach register), voltage
  ±1000 V, current ±5000 A, power ±100 kW, energy ≥ 0 J. Units of the kernel hwmon sysfs ABI
  (Documentation/hwmon/sysfs-interface.rst), converted at the backend edge.
- **Sentinels**: values a driver reports for "no sensor" or a saturated register rather than a
  temperature — −128 °C and −127 °C (a signed 8-bit register's floor: an open thermal diode on
  nct6775/it87/lm90-style chips), 127…128 °C (its ceiling, at any resolution: 127.0, 127.5, 127.875,
  127.996 = 0x7FFF/256), and 0 K (−273.15 °C, NVMe and ACPI zones reporting no reading). A sentinel is a
  reading, not a temperature: it is :attr:`~aithermd.model.Status.IMPLAUSIBLE`.
- **The chip's own physical range** where its driver documents one: coretemp reports TjMax minus the
  digital thermal sensor's readout, which is ≥ 0 and < 128 (Documentation/hwmon/coretemp.rst), so a
  coretemp value above its own ``tempN_crit`` (TjMax) or more than 127 °C below it cannot be real;
  k10temp's Tctl is an 11-bit field in 1/8 °C, optionally offset by −49 °C (k10temp.c: ``CUR_TEMP_SHIFT``,
  ``CUR_TEMP_RANGE_SEL_MASK``), so −49…255.875 °C.

- **A die is above freezing**: a CPU or GPU die (the drivers of :data:`CPU_DRIVERS`, :data:`GPU_DRIVERS`,
  NVML) sits above the air that cools it, in a room above 0 °C, so a reading below :data:`DIE_FLOOR_C` is not
  a temperature; 0 °C is what a GPU's temperature reads when there is no reading (attack4 B6: an NVML die
  temperature stuck at 0 °C was trusted after one confirming read and released a critical cut).
- **A die is above its air by its draw** (a GPU's ``temperature`` judged with its own ``power``,
  :mod:`aithermd.backends.diewatch`): the die sits at least :data:`DIE_K_PER_W` per watt over its heatsink,
  so a reading under ``DIE_FLOOR_C + DIE_K_PER_W × draw`` is not a temperature (3 °C at 208 W: attack5 C1);
  and a reading that stays bit-identical while the draw held two levels :data:`STUCK_SWING_W` apart, each for
  :data:`STUCK_SETTLE_S`, is a stuck sensor (a die moves ≥ 3 °C with such a step within seconds), and so is
  one through two one-minute means of the draw :data:`STUCK_SLOW_SWING_W` apart (:data:`STUCK_SLOW_S`: the
  die and its heatsink move ≥ 2.1 °C, twice a whole degree's quantization), unless it
  sits within :data:`FIRMWARE_BAND_C` of the channel's own lowest threshold, where firmware holds a die flat
  by moving its power (attack5 C1: a reading frozen at 30 or 40 °C released a cut to 598 W).
  Sources: sim/CALIBRATION.md §4 — the H100 SXM dump's die is 0.025 K/W over its heatsink (59 °C at
  629 W), the recorded RTX 4090's 0.05 K/W (35 → 49 °C within 3 s when ~300 W start, 55 → 38 °C within
  6 s when they stop): the die follows its draw within a 1 s sample, the heatsink with τ ≈ 15–30 s.

Rates (°C or RPM per second) are the fastest change a channel of that type shows on real machines; a
faster jump is a spike to be confirmed by the next reading (:mod:`aithermd.backends.trust`). They are
generous on purpose: a CPU die under a load step moves tens of °C within a second (Zen's Tctl rises about
30 °C in under a second at a load step), a GPU die about 10 °C/s; a board thermistor, an NVMe drive or an
ACPI zone move a few °C per second at most.

The fast lane (:mod:`aithermd.watchers.fastlane`) paces its polls by how fast a watched temperature can
*rise* (:func:`rise_rate`): the rate limits above, except for an NVIDIA GPU's NVML temperature
(``temperature.gpu``), paced by :data:`RISE_C_S_NVML`. Its source: the one real trace of that reading,
``nvidia-smi`` at 1 Hz through a training job's load step (realdata/gpu-traces/unknown-nvidia-gpu-windows-
training-1hz-*.csv), rises at most 10 °C in one second (46 → 56 °C at the step), 12 °C in two, 16 °C in
five; the simulator's calibration sees the same step (+14 K within 3 s at +280 W, sim/CALIBRATION.md).
The pacing rate is twice that fastest one-second rise: a rise that fell within half of the sampled second
still keeps under it. The 30 °C/s trust limit stays for spike detection, where generous means fewer real
moves taken for spikes; amdgpu/i915 hwmon dies keep it for pacing too (AMD's junction sensor is spikier
than NVML's, and no trace of it is at hand).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from aithermd.model import Quantity

PLAUSIBLE: Mapping[Quantity, tuple[float, float]] = MappingProxyType({
    Quantity.TEMPERATURE: (-100.0, 200.0),
    Quantity.FAN: (0.0, 50_000.0),
    Quantity.VOLTAGE: (-1000.0, 1000.0),
    Quantity.CURRENT: (-5000.0, 5000.0),
    Quantity.POWER: (-100_000.0, 100_000.0),
    Quantity.ENERGY: (0.0, math.inf),
})

# °C: a signed byte's floor (open diode) and its ceiling at any resolution; 0 K is outside PLAUSIBLE anyway
SENTINEL_FLOOR_C = (-128.0, -127.0)
SENTINEL_CEILING_C = (127.0, 128.0)

# driver → (lowest, highest) °C its temperature register can hold (see the module doc)
DRIVER_RANGE_C: Mapping[str, tuple[float, float]] = MappingProxyType({
    "k10temp": (-49.0, 255.875),
})
# drivers whose reading can never exceed the channel's own crit threshold (TjMax − readout, readout ≥ 0)
BELOW_OWN_CRIT = frozenset({"coretemp"})
READOUT_SPAN_C = 127.0  # coretemp: the digital readout is a 7-bit distance below TjMax

CPU_DRIVERS = frozenset({"coretemp", "k10temp", "zenpower", "cpu_thermal", "x86_pkg_temp"})
GPU_DRIVERS = frozenset({"amdgpu", "nouveau", "radeon", "i915", "xe"})
DIE_FLOOR_C = 1.0  # °C: the lowest a die (CPU, GPU: these drivers and "nvml") can read on a working machine
DIE_K_PER_W = 0.025  # K/W: the least a GPU die sits over its heatsink per watt (H100 SXM; the 4090: 0.05)
STUCK_SWING_W = 120.0  # W: a held draw step that moves a die ≥ 3 K (× DIE_K_PER_W): three whole NVML degrees
STUCK_SETTLE_S = 5.0  # s: a draw counts as held after this long (the die follows within 1 s, settles in 3 s)
HEATSINK_K_PER_W = 0.0104  # K/W: the least a heatsink rises per watt within STUCK_SLOW_S (H100: 1/93 W/K at
# full chassis fans, 1500 J/K: 1 − e^(−60·93/1500) = 98 % settled; the fan-cooled 4090: 1/107 W/K, 600 J/K)
STUCK_SLOW_S = 60.0  # s: the slower check's span: the draw's mean over a minute, the die and its heatsink
STUCK_SLOW_SWING_W = 60.0  # W: a minute's mean step that moves die + heatsink ≥ 2.1 K (× 0.035 K/W)
FIRMWARE_BAND_C = 10.0  # °C under the channel's lowest own threshold: firmware may hold the die flat there
RATE_C_S_CPU = 80.0  # CPU dies: tens of °C within a second at a load step
RATE_C_S_GPU = 30.0  # GPU dies and their memory (hwmon and NVML)
RISE_C_S_NVML = 20.0  # fast-lane pacing of an NVML GPU temperature: 2 × its fastest 1 s rise (module doc)
RATE_C_S_OTHER = 15.0  # board thermistors, drives, NICs, ACPI zones, PSUs
RATE_RPM_S = 10_000.0  # a fan spins from stop to full (≤ 10 000 RPM) in about a second at most
MIN_DT_S = 0.5  # rates are applied over at least this long: two close reads may differ by sensor noise


def temperature_range(driver: str, thresholds: Mapping[str, float]) -> tuple[float, float]:
    """The (lowest, highest) °C a temperature channel of ``driver`` with ``thresholds`` can report."""
    lo, hi = PLAUSIBLE[Quantity.TEMPERATURE]
    if driver in DRIVER_RANGE_C:
        d_lo, d_hi = DRIVER_RANGE_C[driver]
        lo, hi = max(lo, d_lo), min(hi, d_hi)
    if driver in CPU_DRIVERS or driver in GPU_DRIVERS or driver == "nvml":
        lo = max(lo, DIE_FLOOR_C)
    crit = thresholds.get("crit")
    if driver in BELOW_OWN_CRIT and crit is not None:
        lo, hi = max(lo, crit - READOUT_SPAN_C), min(hi, crit)
    return lo, hi


def sentinel(quantity: Quantity, value: float) -> str | None:
    """Why ``value`` (in the channel's unit) is a sentinel rather than a reading, or None."""
    if quantity is not Quantity.TEMPERATURE:
        return None
    if value in SENTINEL_FLOOR_C:
        return f"sentinel {value:g} °C (no sensor or an open diode)"
    if SENTINEL_CEILING_C[0] <= value <= SENTINEL_CEILING_C[1]:
        return f"sentinel {value:g} °C (a saturated register)"
    return None


def rate_limit(quantity: Quantity, driver: str | None) -> float | None:
    """The fastest change per second a channel of this quantity on ``driver`` shows (None: no limit)."""
    if quantity is Quantity.FAN:
        return RATE_RPM_S
    if quantity is not Quantity.TEMPERATURE:
        return None
    if driver in CPU_DRIVERS:
        return RATE_C_S_CPU
    if driver in GPU_DRIVERS or driver == "nvml":
        return RATE_C_S_GPU
    return RATE_C_S_OTHER


def rise_rate(driver: str | None) -> float:
    """The fastest rise (°C/s) the fast lane paces a temperature of ``driver`` by (``nvml``: an NVIDIA GPU
    read through NVML): :data:`RISE_C_S_NVML` for NVML, else the temperature rate limit (module doc)."""
    return RISE_C_S_NVML if driver == "nvml" else rate_limit(Quantity.TEMPERATURE, driver) or math.inf
