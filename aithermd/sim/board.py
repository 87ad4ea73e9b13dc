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
- fans (:mod:`aithermd.sim.fans`): inertia, start above stop threshold, one pwm driving two fans, empty
  headers, a driver that keeps duty in steps, fans that die; the cooling follows each fan's real speed
  (a stalled fan cools nothing) and the tachometers read it; which pwm drives which fan is the board's
  :class:`~aithermd.sim.fans.Wiring`, hidden from the daemon (fan detection finds it);
- readings: the board keeps the true state (``case_air_c``, ``cpu_sink_c``, ``amdgpu_c``, fan duties); the
  files get what each sensor would report of it, quantized to its resolution and jittered
  (:mod:`aithermd.sim.sensor_noise`, which documents each sensor's model and its basis).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from aithermd.sim import thermal, ttar
from aithermd.sim.fans import DEFAULT_WIRING, FanModel, SimDriverIO, Wiring, build_fans
from aithermd.sim.sensor_noise import AMDGPU_EDGE, K10TEMP, NCT_HALF_DEGREE, NCT_SYSTIN, SensorNoise
from aithermd.units import PWM_MAX

DEFAULT_BOARD = "asus-rog-strix-x570-f-nct6798.ttar"
WIDTH = 15  # characters before the newline of every driven file: room for any 64-bit µJ counter

NCT = "devices/platform/nct6775.656/hwmon/hwmon1"
K10 = "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2"
AMDGPU = "devices/pci0000:00/0000:07:00.0/hwmon/hwmon0"
RAPL_PKG = "class/powercap/intel-rapl:0"
RAPL_CORE = "class/powercap/intel-rapl:0:0"

ROOM_C = 24.0  # room air: a model choice (no room temperature was recorded with the board)
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
class Header:
    """One pwm output: its knob files, the automatic-mode floor (the duty found), the levels its driver keeps
    (None: every raw value), and the duty it runs at."""

    pwm: DrivenFile
    enable: DrivenFile | None
    auto_floor_pct: float
    level: Callable[[int], int] | None = None
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


def header_duty_pct(header: Header, auto_pct: float) -> float:
    """The duty a pwm output runs at under its ``pwmN_enable`` mode (hwmon ABI); no enable file = manual.
    A raw value its driver does not keep is put back as the level it keeps (a writer that bypassed the
    driver's store(): a shell, another process)."""
    mode = header.enable.read_knob() if header.enable is not None else 1
    if mode == 0:
        return 100.0
    if mode == 1 or mode is None:
        raw = min(PWM_MAX, max(0, header.pwm.read_knob() or 0))
        if header.level is not None and header.level(raw) != raw:
            raw = header.level(raw)
            header.pwm.write_int(raw)
        return 100.0 * raw / PWM_MAX
    header.pwm.write_int(round(auto_pct * PWM_MAX / 100.0))  # the chip shows its own choice in pwmN
    return auto_pct


class Board:
    """The simulated board under ``sysfs_root`` (the extracted ``sys`` directory).

    Build with :meth:`create`; call :meth:`step` once per physics step; :meth:`close` releases the files
    (the tree stays: the daemon, ``aithermd restore`` or a test may still read it).
    """

    def __init__(self, sysfs_root: Path, *, seed: int = 0, room_c: float = ROOM_C,
                 sensor_noise: bool = True, wiring: Wiring = DEFAULT_WIRING,
                 fan_dies: Mapping[str, float] | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.room_c = room_c
        self.noise = SensorNoise(seed, "board", enabled=sensor_noise)
        self._files: list[DrivenFile] = []
        root = self.sysfs_root
        self.wiring = wiring
        self.t_s = 0.0
        chips = {"nct6798": root / NCT, "amdgpu": root / AMDGPU}
        self.headers: dict[str, Header] = {}
        self.tachs: dict[str, DrivenFile] = {}
        found_rpm_per_pct: dict[str, float] = {}
        for chip, path in chips.items():
            for n in range(1, 10):
                if (path / f"pwm{n}").exists():
                    level = wiring.levels.get(f"{chip}/pwm{n}")
                    self.headers[f"{chip}/pwm{n}"] = self._header(path, n, level)
                if (path / f"fan{n}_input").exists():
                    tach = self.tachs[f"{chip}/fan{n}"] = self._open(path / f"fan{n}_input")
                    pwm = self.headers.get(f"{chip}/pwm{n}")
                    duty = 100.0 * (pwm.pwm.read_int() or 0) / PWM_MAX if pwm is not None else 0.0
                    found_rpm_per_pct[f"{chip}/fan{n}"] = (tach.read_int() or 0) / duty if duty > 0 else 0.0
        self.fans: dict[str, FanModel] = build_fans(wiring, found_rpm_per_pct, fan_dies)
        for tach, model in self.fans.items():  # the fans turn as the tree was recorded
            found = self.tachs[tach].read_int() if tach in self.tachs else None
            if found:
                model.rpm, model.running = float(found), True
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
               room_c: float = ROOM_C, sensor_noise: bool = True, wiring: Wiring = DEFAULT_WIRING,
               fan_dies: Mapping[str, float] | None = None) -> Board:
        """Extract the board archive (default: the shipped X570 board) into ``dest`` (which must not hold a
        ``sys`` yet) and open it. The sysfs root is ``dest/sys``. ``sensor_noise`` False: readings are
        quantized but not jittered (:mod:`aithermd.sim.sensor_noise`); ``wiring``: which pwm drives which
        fan (:data:`~aithermd.sim.fans.DEFAULT_WIRING`); ``fan_dies``: tach → simulated second its fan
        seizes. Raises ``FileExistsError``, ``OSError``."""
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
        return cls(dest / "sys", seed=seed, room_c=room_c, sensor_noise=sensor_noise, wiring=wiring,
                   fan_dies=fan_dies)

    def _open(self, path: Path) -> DrivenFile:
        f = DrivenFile(path)
        self._files.append(f)
        return f

    def _header(self, chip: Path, n: int, level: Callable[[int], int] | None) -> Header:
        pwm = self._open(chip / f"pwm{n}")
        enable = self._open(chip / f"pwm{n}_enable") if (chip / f"pwm{n}_enable").exists() else None
        duty = 100.0 * (pwm.read_int() or 0) / PWM_MAX
        return Header(pwm=pwm, enable=enable, auto_floor_pct=duty, level=level, duty_pct=duty)

    def io(self) -> SimDriverIO:
        """The file access the hwmon backend uses on this board: a :class:`~aithermd.backends.sysfs.SysfsIO`
        that keeps a pwm value as its driver would, at once (the amdgpu's whole percents)."""
        levels = {str(h.pwm.path): h.level for h in self.headers.values() if h.level is not None}
        return SimDriverIO(levels)

    def kill_fan(self, tach: str, at_s: float | None = None) -> None:
        """The fan read by ``tach`` (``"nct6798/fan4"``) seizes at simulated ``at_s`` (default now)."""
        self.fans[tach].dies_at_s = self.t_s if at_s is None else at_s

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

    def airflow_pct(self, node: str) -> float:
        """Mean airflow (% of full, from each fan's real speed) of the fans that cool ``node`` ("case",
        "cpu", "amdgpu"); a dead fan counts, at 0."""
        flows = [self.fans[f.tach or f"fan@{f.pwm or i}"].airflow_pct()
                 for i, f in enumerate(self.wiring.fans) if f.cools == node]
        return sum(flows) / len(flows) if flows else 0.0

    def case_fan_duty_pct(self) -> float:
        """The chassis fans' airflow (% of full): what a passively cooled GPU's airflow follows."""
        return self.airflow_pct("case")

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
        for key, header in self.headers.items():
            source = self.amdgpu_c if key.startswith("amdgpu") else cpu_die_c
            header.duty_pct = header_duty_pct(header, auto_duty_pct(source, header.auto_floor_pct))
        self.t_s += dt_s
        for i, spec in enumerate(self.wiring.fans):
            duty = self.headers[spec.pwm].duty_pct if spec.pwm in self.headers else spec.constant_pct
            self.fans[spec.tach or f"fan@{spec.pwm or i}"].step(dt_s, duty, self.t_s)
        self.cpu_sink_c = thermal.step_temperature_c(
            CPU_THERMAL, self.cpu_sink_c, power_w=self.cpu_power_w, duty_pct=self.airflow_pct("cpu"),
            air_c=self.case_air_c, dt_s=dt_s)
        self.amdgpu_c = thermal.step_temperature_c(
            AMDGPU_THERMAL, self.amdgpu_c, power_w=AMDGPU_POWER_W, duty_pct=self.airflow_pct("amdgpu"),
            air_c=self.case_air_c, dt_s=dt_s)
        case_heat = self.cpu_power_w + AMDGPU_POWER_W + OTHER_HEAT_W + GPU_HEAT_INTO_CASE * gpu_heat_w
        self.case_air_c = thermal.step_temperature_c(
            CASE_THERMAL, self.case_air_c, power_w=case_heat, duty_pct=self.case_fan_duty_pct(),
            air_c=self.room_c, dt_s=dt_s)
        cpu_die_c = self.cpu_sink_c + CPU_R_JUNCTION_K_PER_W * self.cpu_power_w
        self._write(dt_s, cpu_die_c)
        return BoardState(case_air_c=self.case_air_c, cpu_c=cpu_die_c, cpu_power_w=self.cpu_power_w,
                          amdgpu_c=self.amdgpu_c,
                          duties_pct={k: h.duty_pct for k, h in self.headers.items()},
                          rpms={k: float(f.read_int() or 0) for k, f in self.tachs.items()})

    def _write(self, dt_s: float, cpu_die_c: float) -> None:
        """Write what the sensors report of the true state (quantized, jittered: see sensor_noise)."""
        noise = self.noise
        for tach, f in self.tachs.items():
            fan = self.fans.get(tach)
            f.write_int(noise.rpm(fan.rpm) if fan is not None else 0)
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
