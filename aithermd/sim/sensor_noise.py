"""What the simulated sensors report: the true physical state, quantized and jittered as real sensors do.

The physics (:mod:`aithermd.sim.machine`, :mod:`aithermd.sim.board`) keeps the *true* temperatures and fan
speeds; only what is written to sysfs and to the fake NVML passes through this module. Peak temperatures,
slowdown time and every other figure of the summary use the true state.

Each reading is ``quantize(true + jitter, step)``: white Gaussian jitter (one independent draw per reading
and physics step) and the resolution the driver reports in. The jitter's standard deviation grows with the
load of the part measured: ``sigma = idle_sigma_c + (load_sigma_c - idle_sigma_c) * load`` (``load`` 0–1).

Sensor by sensor (``step_c`` / sigma idle → full load), and the basis of each:

- **NVML GPU temperature** (``nvmlDeviceGetTemperature``, ``temperature.gpu``): whole °C (the API returns an
  unsigned int in °C; NVML API reference). Jitter 0.15 → 2.0 °C, ``load`` = the dynamic power
  (draw − idle) as a fraction of (default limit − idle). Measured on the project's recorded
  ``nvidia-smi --query-gpu=...,temperature.gpu`` log at 1 s (a training run, ~317 W; realdata
  ``gpu-traces/unknown-nvidia-gpu-windows-training-...csv``): around a 31 s moving mean, idle readings
  never move (residual std 0.006 °C: one integer held), readings under load scatter with a 2.0 °C residual
  std that is white (lag-1 autocorrelation −0.2) and half-correlated with the ±13 W swings of the draw:
  the die responds in milliseconds to the load, far faster than the lumped heatsink node the model
  integrates. The memory temperature (``NVML_FI_DEV_MEMORY_TEMP``) is reported the same way.
- **k10temp** ``Tctl``/``Tdie``/``Tccd1`` (AMD family 17h): 0.125 °C steps (the kernel's k10temp driver
  reads an 11-bit field of 1/8 °C). Jitter 0.25 → 0.75 °C with the package load (PPT share above idle):
  Tctl is an instantaneous value of the hottest on-die sensor and wanders by a degree or so between polls
  under load (AMD's tools average it for display). An estimate, not a measurement: the project has no
  recorded Tctl time series.
- **nct6798** ``SYSTIN`` (board thermistor, case air): whole °C (an 8-bit register in the nct6775 driver);
  jitter 0.1 °C: an air sensor with a slow thermistor barely moves. ``CPUTIN`` (socket thermistor) and
  ``PECI Agent 0``: 0.5 °C steps (9-bit registers); jitter 0.2 °C.
- **amdgpu** ``edge``: whole °C (the SMU reports integer °C, the driver multiplies by 1000); jitter 0.15 °C
  (a display card at constant power).
- **Fan tachometers** ``fanN_input`` (RPM): the chip counts tach pulses over a window and the driver
  reports whole RPM; counting over a finite window and the fan's own speed ripple give about ±1 % between
  reads: Gaussian, sigma 0.5 % of the speed. A stopped fan reads 0.

All draws come from one :class:`random.Random` per :class:`SensorNoise`, seeded by the machine's seed and a
stream name, so a run is reproducible and the GPUs' readings do not shift when the board's change.
``SensorNoise(..., enabled=False)`` quantizes without jitter (what the simulator did before noise).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TempSensor:
    """How one kind of temperature sensor reports: ``step_c`` (resolution, °C, > 0), jitter standard
    deviations ``idle_sigma_c`` and ``load_sigma_c`` (°C, ≥ 0) at load 0 and 1."""

    step_c: float
    idle_sigma_c: float
    load_sigma_c: float

    def sigma_c(self, load: float) -> float:
        """The jitter's standard deviation (°C) at ``load`` (clamped to 0–1)."""
        share = min(1.0, max(0.0, load))
        return self.idle_sigma_c + (self.load_sigma_c - self.idle_sigma_c) * share


NVML_GPU = TempSensor(step_c=1.0, idle_sigma_c=0.15, load_sigma_c=2.0)
K10TEMP = TempSensor(step_c=0.125, idle_sigma_c=0.25, load_sigma_c=0.75)
NCT_SYSTIN = TempSensor(step_c=1.0, idle_sigma_c=0.1, load_sigma_c=0.1)
NCT_HALF_DEGREE = TempSensor(step_c=0.5, idle_sigma_c=0.2, load_sigma_c=0.2)
AMDGPU_EDGE = TempSensor(step_c=1.0, idle_sigma_c=0.15, load_sigma_c=0.15)
FAN_RPM_SIGMA = 0.005  # relative: a model choice (tach jitter; the recorded trees hold one reading each)


def quantize(value: float, step: float) -> float:
    """``value`` rounded to the nearest multiple of ``step`` (> 0)."""
    return round(value / step) * step


class SensorNoise:
    """Seeded sensor readings. ``seed``: the machine's seed; ``stream``: a name keeping independent
    consumers (the board, the GPUs) on independent draws; ``enabled`` False: quantize only."""

    def __init__(self, seed: int, stream: str, *, enabled: bool = True) -> None:
        self._rng = random.Random(f"{stream}:{seed}")
        self.enabled = enabled

    def temp_c(self, sensor: TempSensor, true_c: float, load: float = 0.0) -> float:
        """What ``sensor`` reports (°C, a multiple of its step) for a true ``true_c`` at ``load`` (0–1)."""
        jitter = self._rng.gauss(0.0, sensor.sigma_c(load)) if self.enabled else 0.0
        return quantize(true_c + jitter, sensor.step_c)

    def temp_mc(self, sensor: TempSensor, true_c: float, load: float = 0.0) -> int:
        """The same in m°C, as hwmon ``tempN_input`` holds it (kernel hwmon sysfs ABI)."""
        return round(self.temp_c(sensor, true_c, load) * 1000.0)

    def rpm(self, true_rpm: float) -> int:
        """A tachometer's reading (whole RPM, ≥ 0) of a fan turning at ``true_rpm``."""
        if true_rpm <= 0 or not math.isfinite(true_rpm):
            return 0
        factor = 1.0 + self._rng.gauss(0.0, FAN_RPM_SIGMA) if self.enabled else 1.0
        return max(0, round(true_rpm * factor))

    def uniform(self, lo: float, hi: float) -> float:
        """A draw from ``lo``–``hi`` on this stream (other jittered readings: the amdgpu's power)."""
        return self._rng.uniform(lo, hi) if self.enabled else (lo + hi) / 2.0
