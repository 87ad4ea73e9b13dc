"""The simulated motherboard: a real machine's sysfs tree, copied per run, whose values move with physics.

The tree is a real one: the ASUS ROG STRIX X570-F (Nuvoton nct6798 Super-I/O, AMD k10temp, an amdgpu
display card) of the project's fixtures, plus the RAPL ``package-0`` and ``core`` powercap zones of
node_exporter's fixture, shipped as one ttar archive under ``aithermd/data/boards/`` and extracted into a
directory of the run's own (never a shared or real tree).

Each step the board reads what the daemon wrote — ``pwmN`` (0–255) and ``pwmN_enable`` (kernel hwmon ABI:
0 full speed, 1 manual, ≥ 2 the chip's automatic mode), RAPL ``constraint_0_power_limit_uw`` (PL1) — and
writes back fan speeds (``fanN_input``, RPM), temperatures (``tempN_input``, m°C), the amdgpu's
``power1_average`` (µW) and RAPL ``energy_uj`` (µJ, wrapping at ``max_energy_range_uj``).

Writes happen in place, on the same inode, through descriptors kept open: ``os.pwrite`` of the whole text
at offset 0, so a reader holding the file open sees each new value. Every file the simulator drives or the
daemon writes is rewritten once at creation to a fixed width (the value, spaces, ``"\\n"``), so a later write
never changes the file's length: a reader sees the old text or the new one, never an empty or torn one,
and a writer that does not truncate (sysfs ignores truncation) cannot leave digits of a longer old value.

The model (constants documented where they are set):

- case air: one thermal node fed by the CPU, the board, and the share of GPU heat that open-air coolers
  blow into the case, cooled by the chassis fans (``pwm1``, ``pwm3``, ``pwm4``); read as ``SYSTIN``;
- CPU: heatsink node cooled by the CPU fan (``pwm2``, the nct6798's CPU_FAN header on ASUS boards) in
  case air, plus a junction-to-case resistance; read as k10temp ``Tctl``/``Tdie``/``Tccd1``, nct6798
  ``CPUTIN`` and ``PECI Agent 0``; package power from utilization, held to PL1 when RAPL enforces it;
- amdgpu display card: a constant ~44 W card with its own fan (``hwmon`` pwm1 of the amdgpu);
- automatic mode: the chip raises a fan from its found duty at 50 °C to full at 85 °C of its source (the
  CPU for the nct6798, the card's edge for the amdgpu), as a stand-in for SmartFan/firmware curves;
- fans: speed proportional to duty (fan affinity law) from each fan's own found RPM/duty ratio, zero below
  a 10 % stall duty; headers that read 0 RPM in the real machine have no fan;
- readings: the board keeps the true state (``case_air_c``, ``cpu_sink_c``, ``amdgpu_c``, fan duties); the
  files get what each sensor would report of it, quantized to its resolution and jittered
  (:mod:`aithermd.sim.sensor_noise`, which documents each sensor's model and its basis).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from aithermd.sim import thermal, ttar
from aithermd.sim.sensor_noise import AMDGPU_EDGE, K10TEMP, NCT_HALF_DEGREE, NCT_SYSTIN, SensorNoise
from aithermd.units import PWM_MAX

DEFAULT_BOARD = "asus-rog-strix-x570-f-nct6798.ttar"
WIDTH = 15  # characters before the newline of every driven file: room for any 64-bit µJ counter

NCT = "devices/platform/nct6775.656/hwmon/hwmon1"
K10 = "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2"
AMDGPU = "devices/pci0000:00/0000:07:00.0/hwmon/hwmon0"
RAPL_PKG = "class/powercap/intel-rapl:0"
RAPL_CORE = "class/powercap/intel-rapl:0:0"

CPU_FAN = 2  # nct6798 fan2/pwm2: CPU_FAN on ASUS boards
CASE_FANS = (1, 3, 4)  # CHA_FAN1..3; fan5/fan6 read 0 RPM on the real board: nothing connected
ROOM_C = 24.0  # room air: a model choice (no room temperature was recorded with the board)
STALL_PCT = 10.0  # a fan stops below this duty: a model choice (PC fans stall at 10–20 % PWM)
CPU_IDLE_W, CPU_PEAK_W = 25.0, 140.0  # a 12–16 core Zen 2 package (142 W PPT)
CPU_R_JUNCTION_K_PER_W = 0.12  # die to heatsink (small chiplet die: hot spot above the sink)
OTHER_HEAT_W = 40.0  # board, VRMs, drives, PSU losses
AMDGPU_POWER_W = 44.15  # what the real card drew when the tree was recorded
GPU_HEAT_INTO_CASE = 0.6  # open-air GPU coolers exhaust most of their heat into the case

# heatsink + die, tower cooler: 0.087 K/W at full fan, 0.67 K/W fanless; tau ~40 s
CPU_THERMAL = thermal.ThermalParams(heat_capacity_j_per_k=350.0, g_passive_w_per_k=1.5, g_fan_w_per_k=10.0)
# the case's air and sheet metal: ~4 K/W·… chassis fans dominate; tau a few minutes at low fan
CASE_THERMAL = thermal.ThermalParams(heat_capacity_j_per_k=6000.0, g_passive_w_per_k=4.0, g_fan_w_per_k=80.0)
# the amdgpu display card: a model choice (the recorded tree reads edge 39 °C at 44.15 W)
AMDGPU_THERMAL = thermal.ThermalParams(heat_capacity_j_per_k=600.0, g_passive_w_per_k=1.0, g_fan_w_per_k=4.0)


class DrivenFile:
    """One sysfs file kept open read-write; values written in place at a fixed width (see module doc)."""

    __slots__ = ("path", "fd", "last")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: int | None = None
        if not os.access(path, os.W_OK):
            os.chmod(path, 0o644)  # the recorded mode may be read-only; this copy is ours to drive
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        value = self.read_int()
        os.ftruncate(self.fd, 0)
        self.write_int(0 if value is None else value)

    def read_int(self) -> int | None:
        """The integer the file holds (first token), or None when it holds none."""
        try:
            return int(os.pread(self.fd, 64, 0).split()[0])
        except (IndexError, ValueError):
            return None

    def read_knob(self) -> int | None:
        """The value a writer left (``echo 26 > pwm1``, with or without a newline), put back in the
        fixed-width form the kernel would show (``"26\\n"`` is what sysfs reads back, never ``"26"``).
        A file caught between a writer's truncation and its write (empty, or not a number) still holds
        the last value, as a kernel attribute would: that value is returned."""
        raw = os.pread(self.fd, 64, 0)
        try:
            value = int(raw.split()[0])
        except (IndexError, ValueError):
            return self.last
        if raw != self._text(value):
            self.write_int(value)
            os.ftruncate(self.fd, WIDTH + 1)
        self.last = value
        return value

    @staticmethod
    def _text(value: int) -> bytes:
        text = str(int(value))
        return (text.ljust(WIDTH) if len(text) < WIDTH else text).encode() + b"\n"

    def write_int(self, value: int) -> None:
        os.pwrite(self.fd, self._text(value), 0)
        self.last = int(value)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


@dataclass(slots=True)
class Fan:
    """One fan header: pwm knob files, the tach file, RPM per duty % found in the real tree, the
    automatic-mode floor (the duty found), and whether a fan is connected."""

    pwm: DrivenFile
    enable: DrivenFile | None
    tach: DrivenFile
    rpm_per_pct: float
    auto_floor_pct: float
    connected: bool
    duty_pct: float = 0.0


@dataclass(frozen=True, slots=True)
class BoardState:
    """What one step produced: temperatures (°C), CPU package power (W), duties (%), RPMs."""

    case_air_c: float
    cpu_c: float
    cpu_power_w: float
    amdgpu_c: float
    duties_pct: dict[str, float] = field(default_factory=dict)
    rpms: dict[str, float] = field(default_factory=dict)


def auto_duty_pct(source_c: float, floor_pct: float) -> float:
    """The stand-in automatic curve: ``floor_pct`` up to 50 °C, linear to 100 % at 85 °C."""
    if source_c <= 50.0:
        return floor_pct
    return min(100.0, floor_pct + (100.0 - floor_pct) * (source_c - 50.0) / 35.0)


def fan_duty_pct(fan: Fan, auto_pct: float) -> float:
    """The duty a fan runs at under its ``pwmN_enable`` mode (hwmon ABI); no enable file = manual."""
    mode = fan.enable.read_knob() if fan.enable is not None else 1
    if mode == 0:
        return 100.0
    if mode == 1 or mode is None:
        raw = fan.pwm.read_knob()
        return 100.0 * min(PWM_MAX, max(0, raw or 0)) / PWM_MAX
    fan.pwm.write_int(round(auto_pct * PWM_MAX / 100.0))  # the chip shows its own choice in pwmN
    return auto_pct


class Board:
    """The simulated board under ``sysfs_root`` (the extracted ``sys`` directory).

    Build with :meth:`create`; call :meth:`step` once per physics step; :meth:`close` releases the files
    (the tree stays: the daemon, ``aithermd restore`` or a test may still read it).
    """

    def __init__(self, sysfs_root: Path, *, seed: int = 0, room_c: float = ROOM_C,
                 sensor_noise: bool = True) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.room_c = room_c
        self.noise = SensorNoise(seed, "board", enabled=sensor_noise)
        self._files: list[DrivenFile] = []
        root = self.sysfs_root
        self.fans: dict[str, Fan] = {}
        for n in range(1, 7):
            self.fans[f"nct6798/pwm{n}"] = self._fan(root / NCT, n)
        self.fans["amdgpu/pwm1"] = self._fan(root / AMDGPU, 1)
        self.temps = {name: self._open(root / rel) for name, rel in {
            "systin": f"{NCT}/temp1_input", "cputin": f"{NCT}/temp2_input", "peci": f"{NCT}/temp7_input",
            "tctl": f"{K10}/temp1_input", "tdie": f"{K10}/temp2_input", "tccd1": f"{K10}/temp3_input",
            "edge": f"{AMDGPU}/temp1_input"}.items()}
        self.amdgpu_power = self._open(root / AMDGPU / "power1_average")
        self.energy = {zone: self._open(root / zone / "energy_uj") for zone in (RAPL_PKG, RAPL_CORE)}
        self.energy_range_uj = {zone: int((root / zone / "max_energy_range_uj").read_text().split()[0])
                                for zone in (RAPL_PKG, RAPL_CORE)}
        names = [f"{zone}/constraint_{i}_power_limit_uw" for zone in (RAPL_PKG, RAPL_CORE) for i in (0, 1)]
        self.pl = {name: self._open(root / name) for name in names if (root / name).exists()}
        self.case_air_c = self.temps["systin"].read_int() / 1000.0  # type: ignore[operator]
        self.cpu_sink_c = self.temps["tdie"].read_int() / 1000.0 - CPU_R_JUNCTION_K_PER_W * CPU_IDLE_W  # type: ignore[operator]
        self.amdgpu_c = self.temps["edge"].read_int() / 1000.0  # type: ignore[operator]
        self.cpu_power_w = CPU_IDLE_W
        self.cpu_energy_j = 0.0

    @classmethod
    def create(cls, dest: str | Path, *, archive: str | Path | None = None, seed: int = 0,
               room_c: float = ROOM_C, sensor_noise: bool = True) -> Board:
        """Extract the board archive (default: the shipped X570 board) into ``dest`` (which must not hold a
        ``sys`` yet) and open it. The sysfs root is ``dest/sys``. ``sensor_noise`` False: readings are
        quantized but not jittered (:mod:`aithermd.sim.sensor_noise`). Raises ``FileExistsError``,
        ``OSError``."""
        dest = Path(dest)
        if (dest / "sys").exists():
            raise FileExistsError(f"{dest / 'sys'} exists: a board needs a directory of its own")
        dest.mkdir(parents=True, exist_ok=True)
        if archive is None:
            shipped = resources.files("aithermd").joinpath("data", "boards", DEFAULT_BOARD)
            with resources.as_file(shipped) as path:
                ttar.extract(path, dest)
        else:
            ttar.extract(archive, dest)
        _set_desktop_rapl_limits(dest / "sys")
        return cls(dest / "sys", seed=seed, room_c=room_c, sensor_noise=sensor_noise)

    def _open(self, path: Path) -> DrivenFile:
        f = DrivenFile(path)
        self._files.append(f)
        return f

    def _fan(self, chip: Path, n: int) -> Fan:
        pwm = self._open(chip / f"pwm{n}")
        enable = self._open(chip / f"pwm{n}_enable") if (chip / f"pwm{n}_enable").exists() else None
        tach = self._open(chip / f"fan{n}_input")
        duty = 100.0 * (pwm.read_int() or 0) / PWM_MAX
        rpm = tach.read_int() or 0
        return Fan(pwm=pwm, enable=enable, tach=tach, rpm_per_pct=rpm / duty if duty > 0 else 0.0,
                   auto_floor_pct=duty, connected=rpm > 0, duty_pct=duty)

    def knob_values(self) -> dict[str, int]:
        """Raw values of every file the daemon may write, keyed by path under the sysfs root: ``pwmN``,
        ``pwmN_enable`` and RAPL ``constraint_N_power_limit_uw`` (for comparing before and after)."""
        out: dict[str, int] = {}
        for f in self._files:
            name = f.path.name
            if name.startswith("pwm") or name.endswith("_power_limit_uw"):
                value = f.read_int()
                if value is not None:
                    out[str(f.path.relative_to(self.sysfs_root))] = value
        return out

    def pl1_w(self) -> float | None:
        """The package PL1 in W when RAPL enforces it (``enabled`` is 1), else None."""
        enabled = (self.sysfs_root / RAPL_PKG / "enabled").read_text().split()
        value = self.pl[f"{RAPL_PKG}/constraint_0_power_limit_uw"].read_knob()
        if not enabled or enabled[0] != "1" or not value:
            return None
        return value / 1e6

    def case_fan_duty_pct(self) -> float:
        """Mean duty of the connected chassis fans (what a passively cooled GPU's airflow follows)."""
        fans = [self.fans[f"nct6798/pwm{n}"] for n in CASE_FANS]
        duties = [f.duty_pct for f in fans if f.connected]
        return sum(duties) / len(duties) if duties else 0.0

    def step(self, dt_s: float, *, cpu_util_pct: float, gpu_heat_w: float) -> BoardState:
        """Advance ``dt_s`` seconds: read the knobs, move fans, heat and energy, write every driven file.

        ``cpu_util_pct`` (0–100) sets the CPU package's demand; ``gpu_heat_w`` is the power the GPUs drew
        (the share :data:`GPU_HEAT_INTO_CASE` of it heats the case air)."""
        for f in self.pl.values():
            f.read_knob()
        cpu_demand = CPU_IDLE_W + min(100.0, max(0.0, cpu_util_pct)) / 100.0 * (CPU_PEAK_W - CPU_IDLE_W)
        pl1 = self.pl1_w()
        self.cpu_power_w = min(cpu_demand, pl1) if pl1 is not None else cpu_demand
        cpu_die_c = self.cpu_sink_c + CPU_R_JUNCTION_K_PER_W * self.cpu_power_w
        for key, fan in self.fans.items():
            source = self.amdgpu_c if key.startswith("amdgpu") else cpu_die_c
            fan.duty_pct = fan_duty_pct(fan, auto_duty_pct(source, fan.auto_floor_pct))
        cpu_fan = self.fans[f"nct6798/pwm{CPU_FAN}"].duty_pct
        self.cpu_sink_c = thermal.step_temperature_c(
            CPU_THERMAL, self.cpu_sink_c, power_w=self.cpu_power_w, duty_pct=cpu_fan, air_c=self.case_air_c,
            dt_s=dt_s)
        self.amdgpu_c = thermal.step_temperature_c(
            AMDGPU_THERMAL, self.amdgpu_c, power_w=AMDGPU_POWER_W, duty_pct=self.fans["amdgpu/pwm1"].duty_pct,
            air_c=self.case_air_c, dt_s=dt_s)
        case_heat = self.cpu_power_w + AMDGPU_POWER_W + OTHER_HEAT_W + GPU_HEAT_INTO_CASE * gpu_heat_w
        self.case_air_c = thermal.step_temperature_c(
            CASE_THERMAL, self.case_air_c, power_w=case_heat, duty_pct=self.case_fan_duty_pct(),
            air_c=self.room_c, dt_s=dt_s)
        cpu_die_c = self.cpu_sink_c + CPU_R_JUNCTION_K_PER_W * self.cpu_power_w
        self._write(dt_s, cpu_die_c)
        return BoardState(case_air_c=self.case_air_c, cpu_c=cpu_die_c, cpu_power_w=self.cpu_power_w,
                          amdgpu_c=self.amdgpu_c,
                          duties_pct={k: f.duty_pct for k, f in self.fans.items()},
                          rpms={k: float(f.tach.read_int() or 0) for k, f in self.fans.items()})

    def _write(self, dt_s: float, cpu_die_c: float) -> None:
        """Write what the sensors report of the true state (quantized, jittered: see sensor_noise)."""
        noise = self.noise
        for fan in self.fans.values():
            on = fan.connected and fan.duty_pct >= STALL_PCT
            fan.tach.write_int(noise.rpm(fan.rpm_per_pct * fan.duty_pct) if on else 0)
        t = self.temps
        load = (self.cpu_power_w - CPU_IDLE_W) / (CPU_PEAK_W - CPU_IDLE_W)
        t["systin"].write_int(noise.temp_mc(NCT_SYSTIN, self.case_air_c))
        t["cputin"].write_int(noise.temp_mc(NCT_HALF_DEGREE, self.cpu_sink_c))
        t["peci"].write_int(noise.temp_mc(NCT_HALF_DEGREE, cpu_die_c + 1.0))
        tctl = noise.temp_mc(K10TEMP, cpu_die_c, load)
        for name in ("tctl", "tdie"):  # one register: Tdie = Tctl minus an offset, 0 on this CPU
            t[name].write_int(tctl)
        t["tccd1"].write_int(noise.temp_mc(K10TEMP, cpu_die_c + 5.0 + 0.06 * self.cpu_power_w, load))
        t["edge"].write_int(noise.temp_mc(AMDGPU_EDGE, self.amdgpu_c))
        self.amdgpu_power.write_int(round((AMDGPU_POWER_W + noise.uniform(-0.5, 0.5)) * 1e6))
        self.cpu_energy_j += self.cpu_power_w * dt_s
        for zone, share in ((RAPL_PKG, 1.0), (RAPL_CORE, 0.7)):
            counter = self.energy[zone]
            span = self.energy_range_uj[zone] + 1
            added_uj = round(share * self.cpu_power_w * dt_s * 1e6)
            counter.write_int(((counter.read_int() or 0) + added_uj) % span)

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files.clear()


def _set_desktop_rapl_limits(root: Path) -> None:
    """The recorded RAPL zone (node_exporter's fixture) carries firmware's "unlimited" 4090 W PL1/PL2 above
    its own 95 W ``constraint_0_max_power_uw``. The simulated package starts as a desktop CPU is shipped:
    PL1 at that 95 W maximum and PL2 at 1.25 × PL1, the usual short-term ratio, so PL1/PL2 mean something
    on screen and a policy's cap visibly moves them."""
    pkg = root / RAPL_PKG
    max_file = pkg / "constraint_0_max_power_uw"
    max_uw = max_file.read_text().strip() if max_file.exists() else ""
    if not max_uw.isdigit() or int(max_uw) <= 0:
        return
    pl1 = int(max_uw)
    for name, value in (("constraint_0_power_limit_uw", pl1), ("constraint_1_power_limit_uw", pl1 * 5 // 4)):
        if (pkg / name).exists():
            (pkg / name).write_text(f"{value}\n")
