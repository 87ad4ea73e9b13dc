"""Fans as they really turn, for the simulated board: inertia, a start threshold above the stop threshold,
duty a driver keeps only in steps, headers wired to one tachometer, two, or none, and fans that die.

What the board hides, and fan detection and calibration (:mod:`aithermd.fans`) must find, is a
:class:`Wiring`: which fan (and tachometer input) each pwm output drives. The default,
:data:`DEFAULT_WIRING`, on the X570's nct6798 and amdgpu:

- ``pwm1`` → ``fan1`` (CHA_FAN1), ``pwm3`` → ``fan3`` (CHA_FAN2), ``pwm4`` → ``fan4`` (CHA_FAN3);
- ``pwm2`` → ``fan2`` *and* ``fan5``: the tower cooler's second fan on CPU_OPT, which boards drive from
  CPU_FAN's pwm output (one pwm, two fans, two tachometers);
- ``pwm5`` and ``pwm6`` drive nothing; ``fan6`` reads 0 (empty headers: 0 RPM in the recorded tree);
- the amdgpu's ``pwm1`` → its ``fan1``; the card keeps whole percents of duty (:func:`amdgpu_level`).

Constants, and where they come from:

- **Speed**: proportional to duty (the fan affinity law) above the stop threshold, from each fan's own RPM at
  its duty in the recorded tree (fan1 678 RPM at pwm 93, ...).
- **Start and stop thresholds**: a stopped fan starts only at :attr:`FanModel.start_pct`, a running one
  keeps turning down to :attr:`FanModel.stop_pct`. Users measure 30–35 % to start and about 20 % to keep
  running for case fans, and CPU fans that need far more to start than to run (FanControl issues #49/#51,
  fan2go #49: fancontrol's stop level pwm 30 against fan2go's start level 151–169); the Intel 4-wire PWM
  fan specification asks a fan to keep running down to 20 % duty. Case fans here: start 30 %, stop 20 %;
  the CPU cooler's fans: start 25 %, stop 15 %; the amdgpu: start 20 %, stop 12 %.
- **Inertia**: first-order spin-up and spin-down. A measured 4-wire fan (iceteaSA/unifi-fan-control #42,
  UCG-Max: pwm 128 → 2705 RPM after 1 s, 3609 after 2 s, 4128 settled; pwm 0 → stopped within 6 s) gives
  a spin-up time constant of about 1 s; coasting down is slower (:data:`SPIN_DOWN_S`).
- **Death**: a fan given ``dies_at_s`` seizes then (a failed bearing): it stops within its spin-down.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aithermd.backends.sysfs import SysfsIO

SPIN_UP_S = 1.0  # iceteaSA/unifi-fan-control #42: 65 % of the step after 1 s, 87 % after 2 s
SPIN_DOWN_S = 1.5  # stopped within 6 s of pwm 0 (same measurement): ~4 time constants
STILL_RPM = 30.0  # below this a coasting fan gives no tach pulse the chip can count: it reads 0


def amdgpu_level(raw: int) -> int:
    """The amdgpu card's pwm1 read-back after ``raw`` is written: the SMU keeps the fan duty in whole percent
    (``round(pwm * 100 / 255)``) and shows it back in 0–255 rounded up (``ceil(percent * 255 / 100)``), so
    a value read back is kept as it is. fan2go #371 reports this round trip on a Radeon card: 5 written, 6
    read (2 %); 65 reads back 64."""
    raw = min(255, max(0, int(raw)))
    return math.ceil(round(raw * 100 / 255) * 255 / 100)


@dataclass
class FanModel:
    """One physical fan: RPM at full duty, thresholds (%), and its state (``rpm``, ``running``)."""

    max_rpm: float
    start_pct: float = 30.0
    stop_pct: float = 20.0
    dies_at_s: float | None = None
    rpm: float = 0.0
    running: bool = False
    dead: bool = False

    def target_rpm(self, duty_pct: float) -> float:
        return self.max_rpm * duty_pct / 100.0

    def step(self, dt_s: float, duty_pct: float, t_s: float) -> float:
        """Advance ``dt_s`` s at ``duty_pct`` at simulated time ``t_s``; returns the new RPM."""
        if self.dies_at_s is not None and t_s >= self.dies_at_s:
            self.dead = True
        if self.dead or duty_pct < self.stop_pct:
            self.running = False
        elif not self.running and duty_pct >= self.start_pct:
            self.running = True
        target = self.target_rpm(duty_pct) if self.running else 0.0
        tau = SPIN_UP_S if target > self.rpm else SPIN_DOWN_S
        self.rpm = target + (self.rpm - target) * math.exp(-dt_s / tau)
        if not self.running and self.rpm < STILL_RPM:
            self.rpm = 0.0
        return self.rpm

    def airflow_pct(self) -> float:
        """Airflow as % of full (proportional to speed, the fan affinity law)."""
        return 100.0 * self.rpm / self.max_rpm if self.max_rpm > 0 else 0.0


@dataclass(frozen=True)
class FanSpec:
    """One fan of a :class:`Wiring`: the tachometer input it is read by (``None``: no tach wire), the pwm
    output that drives it (``None``: constant speed, e.g. a pump on SATA power, at ``constant_pct``),
    its thresholds, and its RPM at full duty (``None``: from the recorded tree's RPM at its duty)."""

    tach: str | None
    pwm: str | None
    start_pct: float = 30.0
    stop_pct: float = 20.0
    max_rpm: float | None = None
    constant_pct: float = 100.0
    cools: str = "case"  # "case" | "cpu" | "amdgpu": which node its airflow cools


@dataclass(frozen=True)
class Wiring:
    """What the board hides: its fans (tach and pwm as ``"<chip>/<file>"``: ``"nct6798/fan2"``,
    ``"nct6798/pwm2"``), the levels a driver keeps per pwm (``levels``: pwm → raw → raw kept)."""

    fans: tuple[FanSpec, ...]
    levels: Mapping[str, Callable[[int], int]] = field(default_factory=dict)

    def driven_by(self, pwm: str) -> tuple[FanSpec, ...]:
        return tuple(f for f in self.fans if f.pwm == pwm)


DEFAULT_WIRING = Wiring(
    fans=(
        FanSpec("nct6798/fan1", "nct6798/pwm1"),
        FanSpec("nct6798/fan2", "nct6798/pwm2", start_pct=25.0, stop_pct=15.0, cools="cpu"),
        FanSpec("nct6798/fan5", "nct6798/pwm2", start_pct=25.0, stop_pct=15.0, max_rpm=1500.0, cools="cpu"),
        FanSpec("nct6798/fan3", "nct6798/pwm3"),
        FanSpec("nct6798/fan4", "nct6798/pwm4"),
        FanSpec("amdgpu/fan1", "amdgpu/pwm1", start_pct=20.0, stop_pct=12.0, cools="amdgpu"),
    ),
    levels={"amdgpu/pwm1": amdgpu_level},
)


def build_fans(wiring: Wiring, recorded_rpm_per_pct: Mapping[str, float],
               dies: Mapping[str, float] | None = None) -> dict[str, FanModel]:
    """A :class:`FanModel` per fan of ``wiring``, keyed by its tach (or ``"fan@<pwm>"`` without one);
    ``recorded_rpm_per_pct``: tach → RPM per % found in the recorded tree; ``dies``: tach → when it seizes
    (simulated s)."""
    out: dict[str, FanModel] = {}
    for i, spec in enumerate(wiring.fans):
        key = spec.tach or f"fan@{spec.pwm or i}"
        max_rpm = spec.max_rpm if spec.max_rpm is not None else 100.0 * recorded_rpm_per_pct.get(key, 0.0)
        if max_rpm <= 0:
            max_rpm = 1500.0  # a 120 mm case fan's typical top speed, where the tree recorded none
        out[key] = FanModel(max_rpm=max_rpm, start_pct=spec.start_pct, stop_pct=spec.stop_pct,
                            dies_at_s=(dies or {}).get(key))
    return out


class SimDriverIO(SysfsIO):
    """File access for the hwmon backend on the simulated board: a write to a pwm whose driver keeps levels
    lands as the level it keeps, at once, as the driver's ``store()`` would (``levels``: path → function)."""

    def __init__(self, levels: Mapping[str, Callable[[int], int]]) -> None:
        self.levels = {os.path.realpath(p): fn for p, fn in levels.items()}

    def write(self, path: str, data: bytes) -> None:
        level = self.levels.get(os.path.realpath(path)) if self.levels else None
        if level is not None:
            try:
                data = b"%d\n" % level(int(data))
            except ValueError:
                pass
        super().write(path, data)
