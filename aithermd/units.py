"""The only place unit arithmetic lives.

Inside the daemon every quantity is in °C, W, J, %, V, A, RPM, MHz or seconds. Backends convert raw
hardware units at their edge with these helpers:

- kernel hwmon sysfs ABI (Documentation/hwmon/sysfs-interface.rst): temperatures in m°C, voltages in mV,
  currents in mA, power in µW, energy in µJ, fans in RPM, ``pwmN`` 0–255;
- powercap (Documentation/power/powercap/powercap.rst): ``energy_uj`` in µJ, ``*_power_limit_uw`` in µW,
  ``time_window_us`` in µs;
- NVML API reference: power in mW, energy in mJ, temperatures in °C, utilization in %.
"""

from __future__ import annotations

PWM_MAX = 255


def mc_to_c(millidegrees: float) -> float:
    """m°C (hwmon ``tempN_*``) → °C."""
    return millidegrees / 1000.0


def c_to_mc(celsius: float) -> int:
    """°C → m°C, rounded to an integer as sysfs expects."""
    return round(celsius * 1000.0)


def mv_to_v(millivolts: float) -> float:
    """mV (hwmon ``inN_*``) → V."""
    return millivolts / 1000.0


def ma_to_a(milliamps: float) -> float:
    """mA (hwmon ``currN_*``) → A."""
    return milliamps / 1000.0


def uw_to_w(microwatts: float) -> float:
    """µW (hwmon ``powerN_*``, powercap ``*_power_limit_uw``) → W."""
    return microwatts / 1_000_000.0


def w_to_uw(watts: float) -> int:
    """W → µW, rounded to an integer."""
    return round(watts * 1_000_000.0)


def uj_to_j(microjoules: float) -> float:
    """µJ (hwmon ``energyN_input``, powercap ``energy_uj``) → J."""
    return microjoules / 1_000_000.0


def mw_to_w(milliwatts: float) -> float:
    """mW (NVML power usage and limits) → W."""
    return milliwatts / 1000.0


def w_to_mw(watts: float) -> int:
    """W → mW, rounded to an integer (NVML ``nvmlDeviceSetPowerManagementLimit`` takes mW)."""
    return round(watts * 1000.0)


def mj_to_j(millijoules: float) -> float:
    """mJ (NVML ``nvmlDeviceGetTotalEnergyConsumption``) → J."""
    return millijoules / 1000.0


def us_to_s(microseconds: float) -> float:
    """µs (powercap ``time_window_us``) → s."""
    return microseconds / 1_000_000.0


def pwm_to_pct(pwm: float) -> float:
    """hwmon ``pwmN`` (0–255) → duty in % (0–100)."""
    return max(0.0, min(100.0, pwm * 100.0 / PWM_MAX))


def pct_to_pwm(duty_pct: float) -> int:
    """Duty in % → hwmon ``pwmN`` (0–255), clamped and rounded."""
    return max(0, min(PWM_MAX, round(duty_pct * PWM_MAX / 100.0)))


def rounded(value: float | None, digits: int = 2) -> float | None:
    """``value`` to ``digits`` decimals for logs and events (a pwm read back as 93/255 is 36.47 %, not
    36.470588235294116); None stays None."""
    return None if value is None else round(value, digits)


def num(value: float | None) -> str:
    """A knob value in a message: at most one decimal, no trailing zeros ("36.5", "450"); None → "?"."""
    if value is None:
        return "?"
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text
