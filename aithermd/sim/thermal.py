"""A lumped (single-node) thermal model of one device and its cooler. Pure: no I/O, no clock.

The device and its heatsink are one thermal mass ``C`` (J/K) that gains the electrical power it
dissipates, ``P`` (W, all of it becomes heat), and loses heat to the air around it through a thermal
conductance ``G`` (W/K, the inverse of the thermal resistance ``R = 1/G`` in K/W)::

    C · dT/dt = P − G(duty) · (T − T_air)

``G`` falls as the fan slows: a passive part (natural convection and conduction into the board, present
even with the fan stopped) plus a forced-convection part that grows with airflow::

    G(duty) = g_passive_w_per_k + g_fan_w_per_k · (duty_pct / 100) ** airflow_exponent

Sources of the shape:

- fan affinity laws: a fan's airflow is proportional to its speed, and below full speed a PWM fan's speed
  is close to proportional to its duty cycle;
- forced convection correlations: the heat transfer coefficient of air flowing over fins grows as
  ``Re ** 0.5`` (laminar boundary layer over a flat plate) to ``Re ** 0.8`` (turbulent, Dittus–Boelter),
  Re being proportional to the air velocity; the default exponent 0.7 sits between the two;
- "lumped capacitance" first-order model of electronics cooling (Incropera & DeWitt, *Fundamentals of
  Heat and Mass Transfer*, ch. 5), the same model vendors use to quote heatsink resistances in K/W.

For constant ``P``, ``G`` and ``T_air`` over a step the equation has an exact solution, which
:func:`step_temperature_c` uses, so any step length is stable (no explicit-Euler blow-up at large
``dt``)::

    T_ss = T_air + P / G          tau = C / G
    T(t + dt) = T_ss + (T(t) − T_ss) · exp(−dt / tau)

The parameters of the simulated devices are chosen so that the steady states match what such hardware
shows in practice (documented where :mod:`aithermd.sim.machine` builds them); they are a model, not a
measurement of one unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThermalParams:
    """One device's thermal constants.

    - ``heat_capacity_j_per_k``: C, the heat that raises device plus heatsink by 1 K (J/K), > 0;
    - ``g_passive_w_per_k``: conductance to the air with the fan stopped (W/K), ≥ 0;
    - ``g_fan_w_per_k``: extra conductance at 100 % fan duty (W/K), ≥ 0;
    - ``airflow_exponent``: how convection grows with airflow (0.5 laminar … 0.8 turbulent).

    Raises ``ValueError`` when a constant is out of range, or when the conductance at 0 % duty is 0
    (a device that cannot shed heat has no steady state).
    """

    heat_capacity_j_per_k: float
    g_passive_w_per_k: float
    g_fan_w_per_k: float
    airflow_exponent: float = 0.7

    def __post_init__(self) -> None:
        if not self.heat_capacity_j_per_k > 0:
            raise ValueError(f"heat_capacity_j_per_k must be > 0, got {self.heat_capacity_j_per_k}")
        if self.g_passive_w_per_k < 0 or self.g_fan_w_per_k < 0:
            raise ValueError("conductances must be >= 0")
        if self.g_passive_w_per_k == 0:
            raise ValueError("g_passive_w_per_k must be > 0: a device must shed heat with its fan stopped")
        if not 0 < self.airflow_exponent <= 1.5:
            raise ValueError(f"airflow_exponent must be in (0, 1.5], got {self.airflow_exponent}")

    @classmethod
    def from_design_point(cls, *, power_w: float, rise_at_full_fan_k: float, rise_passive_at_w: float,
                          passive_rise_k: float, time_constant_s: float,
                          airflow_exponent: float = 0.7) -> ThermalParams:
        """Constants that meet two observable steady states and a time constant.

        ``power_w`` at 100 % fan settles ``rise_at_full_fan_k`` above the air; ``rise_passive_at_w``
        with the fan stopped settles ``passive_rise_k`` above it; at 100 % fan the device reaches 63 % of a
        step in ``time_constant_s``. Example: an RTX 4090 cooler holding 450 W at 30 K over its intake air
        with the fans at full, and 27 W at 12 K with its fans stopped (zero-RPM idle), settling in ~100 s.
        """
        g_full = power_w / rise_at_full_fan_k
        g_passive = rise_passive_at_w / passive_rise_k
        g_fan = max(0.0, g_full - g_passive)
        return cls(heat_capacity_j_per_k=time_constant_s * max(g_full, g_passive),
                   g_passive_w_per_k=g_passive, g_fan_w_per_k=g_fan, airflow_exponent=airflow_exponent)


def conductance_w_per_k(params: ThermalParams, duty_pct: float) -> float:
    """G(duty) in W/K; ``duty_pct`` is clamped to 0–100 %."""
    duty = min(100.0, max(0.0, duty_pct)) / 100.0
    return params.g_passive_w_per_k + params.g_fan_w_per_k * duty ** params.airflow_exponent


def thermal_resistance_k_per_w(params: ThermalParams, duty_pct: float) -> float:
    """R(duty) = 1 / G(duty) in K/W: falls as the fan speeds up."""
    return 1.0 / conductance_w_per_k(params, duty_pct)


def steady_state_c(params: ThermalParams, *, power_w: float, duty_pct: float, air_c: float) -> float:
    """The temperature (°C) the device settles at: ``air_c + power_w · R(duty)``."""
    return air_c + power_w / conductance_w_per_k(params, duty_pct)


def step_temperature_c(params: ThermalParams, temp_c: float, *, power_w: float, duty_pct: float,
                       air_c: float, dt_s: float) -> float:
    """The temperature (°C) after ``dt_s`` seconds of constant power, fan duty and air temperature.

    Exact solution of the lumped model (see the module docstring); ``dt_s`` ≥ 0, 0 returns ``temp_c``.
    Raises ``ValueError`` for a negative ``dt_s``.
    """
    if dt_s < 0:
        raise ValueError(f"dt_s must be >= 0, got {dt_s}")
    g = conductance_w_per_k(params, duty_pct)
    target = air_c + power_w / g
    return target + (temp_c - target) * math.exp(-dt_s * g / params.heat_capacity_j_per_k)
