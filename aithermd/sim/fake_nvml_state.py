"""The GPUs behind the fake NVML: their state in NVML's own units, and its JSON file.

Units follow the NVML API reference: power and limits in mW, energy in mJ, temperatures in °C, utilization
and fan duty in %, clocks in MHz, clock-event reasons as the ``nvmlClocksEventReason*`` bit mask.

The file (``state_path``) lets a second process (``aithermd restore`` after a crash) see the same GPUs: it
holds each GPU's profile, bus id and UUID, and the *control* state every NVML write changes (management
power limit, per-fan target and mode, lost/removed). A process that finds the file changed on disk takes
the control state from it; dynamic readings (temperature, power draw, ...) stay per process, driven by the
simulator, and are written along for a fresh process to start from.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid as uuidlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.profiles import profile_from_dict, profile_to_dict
from aithermd.units import w_to_mw

FORMAT = "aithermd-fake-nvml/1"
DEFAULT_DRIVER = "550.127.05"
# nvmlClocksEventReason* bits (nvml.h)
REASON_BITS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80,
        "display_clocks_setting": 0x100,
        "board_limit": 0x200,
        "reliability": 0x400,
    }
)
PRE_VOLTA = frozenset({"kepler", "maxwell", "pascal"})
_UUID_NS = uuidlib.UUID("6f1c5b1e-5a0c-4f43-9d59-61746865726d")  # fixed: the same GPU gets the same UUID


def reasons_mask(names: Any) -> int:
    """A clock-event reason bit mask from an int (kept) or names (``"sw_power_cap"``, ...)."""
    if isinstance(names, int):
        return names
    return sum(REASON_BITS[n] for n in set(names))


def derived_uuid(bus_id: str, name: str) -> str:
    """A stable, unique-per-bus-id NVML-style UUID (``GPU-xxxxxxxx-xxxx-...``) for a masked dump."""
    return "GPU-" + str(uuidlib.uuid5(_UUID_NS, f"{bus_id}/{name}"))


def _mw(watts: float | None) -> int | None:
    return None if watts is None else w_to_mw(watts)


@dataclass
class FakeFan:
    """One fan: present duty ``speed_pct``, ``target_pct`` (what was asked), ``manual`` (policy manual vs
    the driver's automatic curve), ``auto_pct`` (the duty the automatic curve gives; set by the simulator)."""

    speed_pct: int = 30
    target_pct: int = 30
    manual: bool = False
    auto_pct: int = 30


PROCESS_SAMPLES = 100  # per-process utilization samples the driver keeps per GPU (a ring; older ones drop)


@dataclass
class FakeProcess:
    """A process holding a GPU: in the compute list, the graphics list or both (nvidia-smi's ``C``, ``G``,
    ``C+G``); ``used_memory_bytes`` None is NVML_VALUE_NOT_AVAILABLE (Windows WDDM); MIG instance ids None
    when MIG is off (NVML reports 0xFFFFFFFF)."""

    pid: int
    compute: bool = True
    graphics: bool = False
    used_memory_bytes: int | None = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @classmethod
    def from_info(cls, info: Any) -> FakeProcess:
        kind = info.type.upper()
        mib = info.used_memory_mib
        return cls(info.pid, compute="C" in kind, graphics="G" in kind,
                   used_memory_bytes=None if mib is None else int(mib * (1 << 20)),
                   gpu_instance_id=info.gpu_instance_id, compute_instance_id=info.compute_instance_id)


@dataclass
class FakeGpu:
    """One GPU. Static facts come from ``profile``; control and dynamic values are NVML units."""

    profile: GpuProfile
    bus_id: str
    uuid: str
    limit_mw: int | None = None
    fans: list[FakeFan] = field(default_factory=list)
    lost: bool = False
    removed: bool = False
    locked_clocks: tuple[int, int] | None = None  # (min, max) MHz as set; see fake_nvml_clocks
    temp_c: float | None = None
    memory_temp_c: float | None = None
    power_mw: int | None = None
    energy_mj: int = 0
    gpu_util_pct: int | None = None
    memory_util_pct: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    reasons: int = 0
    persistence: bool | None = None
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    # (timestamp µs, pid, smUtil, memUtil, encUtil, decUtil), oldest first: what
    # nvmlDeviceGetProcessUtilization returns (only processes with non-zero utilization get samples)
    util_samples: deque[tuple[int, int, int, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=PROCESS_SAMPLES))
    pstate: str | None = None
    gpm_tensor_pct: float = 0.0  # what the simulator says the tensor pipes do now (%)
    gpm_elapsed_s: float = 0.0  # GPM counters: time, busy time and tensor-active time (s)
    gpm_busy_s: float = 0.0
    gpm_tensor_s: float = 0.0
    cap_mw: int | None = None  # an out-of-band cap (BMC, nvidia-powerd): the enforced limit stays under it
    # a driver that keeps a management limit only in steps of limit_step_mw (the nearest), and not under
    # limit_floor_mw (a floor above the minimum it reports): the set call succeeds, the read-back differs
    limit_step_mw: int | None = None
    limit_floor_mw: int | None = None
    limit_refused_below_mw: int | None = None  # or refuses (INVALID_ARGUMENT) under it: vGPU, Dynamic Boost
    epoch: int = 0  # incremented when the GPU comes back from a reset: older handles are stale
    # the acoustic threshold (nvidia-smi's GPU Target Temperature) as set, None: the dump's; its range, as
    # NVML's ACOUSTIC_MIN/MAX report it: no recorded dump has one, so only a test gives it (else
    # NOT_SUPPORTED, as a driver without the range answers)
    target_temp_c: int | None = None
    acoustic_range_c: tuple[int, int] | None = None

    @classmethod
    def from_profile(cls, profile: GpuProfile, bus_id: str, fan_count: int | None = None) -> FakeGpu:
        p = profile
        duty = int(p.fan_speeds_pct[0]) if p.fan_speeds_pct else 30
        n = len(p.fan_speeds_pct) if fan_count is None else fan_count
        same_bus = bus_id == p.pci_bus_id
        return cls(
            profile=p,
            bus_id=bus_id,
            uuid=(p.uuid if p.uuid and same_bus else derived_uuid(bus_id, p.name)),
            limit_mw=_mw(p.power_limit_w if p.power_limit_w is not None else p.default_power_limit_w),
            fans=[FakeFan(duty, duty, False, duty) for _ in range(n)],
            temp_c=p.temp_c,
            memory_temp_c=p.memory_temp_c,
            power_mw=_mw(p.power_draw_w),
            gpu_util_pct=_int(p.gpu_util_pct),
            memory_util_pct=_int(p.memory_util_pct),
            sm_clock_mhz=_int(p.sm_clock_mhz),
            memory_clock_mhz=_int(p.memory_clock_mhz),
            reasons=reasons_mask(r for r in p.clock_event_reasons if r in REASON_BITS),
            persistence=p.persistence_mode,
            processes={info.pid: FakeProcess.from_info(info) for info in p.processes},
            pstate=p.pstate,
        )

    @property
    def mig(self) -> bool:
        """MIG mode on (the dump's ``MIG Mode: Current``): per-process utilization is not supported."""
        return self.profile.extra.get("mig_mode", "").lower() == "enabled"

    def memory_used_bytes(self) -> int:
        """The dump's used memory less what its processes held (the driver's own reservation), plus what the
        processes hold now."""
        mib = 1 << 20
        held_then = sum(int((i.used_memory_mib or 0) * mib) for i in self.profile.processes)
        base = max(0, int((self.profile.memory_used_mib or 0) * mib) - held_then)
        return base + sum(p.used_memory_bytes or 0 for p in self.processes.values())

    # static facts (mW, °C)
    @property
    def min_mw(self) -> int | None:
        return _mw(self.profile.min_power_limit_w)

    @property
    def max_mw(self) -> int | None:
        return _mw(self.profile.max_power_limit_w)

    @property
    def default_mw(self) -> int | None:
        return _mw(self.profile.default_power_limit_w)

    @property
    def enforced_mw(self) -> int | None:
        """min(management limit, any other cap the dump showed: enforced below requested, e.g. GH200, and
        an out-of-band cap set by :meth:`FakeNvml.cap_power`)."""
        p, limit = self.profile, self.limit_mw
        if limit is None:
            enforced = _mw(p.enforced_power_limit_w)
        elif (
            p.enforced_power_limit_w is not None
            and p.power_limit_w is not None
            and p.enforced_power_limit_w < p.power_limit_w
        ):
            enforced = min(limit, w_to_mw(p.enforced_power_limit_w))
        else:
            enforced = limit
        return enforced if self.cap_mw is None or enforced is None else min(enforced, self.cap_mw)

    @property
    def energy_counter(self) -> bool:
        """NVML: nvmlDeviceGetTotalEnergyConsumption is "for Volta or newer"; Kepler, Maxwell and Pascal
        boards answer NOT_SUPPORTED (an unknown architecture is taken as newer)."""
        return (self.profile.architecture or "").strip().lower() not in PRE_VOLTA

    @property
    def present(self) -> bool:
        return not self.removed

    def control(self) -> dict[str, Any]:
        return {
            "limit_mw": self.limit_mw,
            "lost": self.lost,
            "removed": self.removed,
            "fans": [vars(f).copy() for f in self.fans],
            "locked_clocks": None if self.locked_clocks is None else list(self.locked_clocks),
            "target_temp_c": self.target_temp_c,
        }

    def apply_control(self, data: dict[str, Any]) -> None:
        self.limit_mw, self.lost, self.removed = data["limit_mw"], data["lost"], data["removed"]
        self.fans = [FakeFan(**f) for f in data["fans"]]
        locked = data.get("locked_clocks")
        self.locked_clocks = None if locked is None else (int(locked[0]), int(locked[1]))
        self.target_temp_c = data.get("target_temp_c")

    def dynamic(self) -> dict[str, Any]:
        keys = (
            "temp_c",
            "memory_temp_c",
            "power_mw",
            "energy_mj",
            "gpu_util_pct",
            "memory_util_pct",
            "sm_clock_mhz",
            "memory_clock_mhz",
            "reasons",
            "persistence",
            "pstate",
            "gpm_tensor_pct",
            "gpm_elapsed_s",
            "gpm_busy_s",
            "gpm_tensor_s",
        )
        return {k: getattr(self, k) for k in keys}


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def unique_bus_ids(profiles: list[GpuProfile]) -> list[str]:
    """Each profile's bus id, moved to the next free bus number where two profiles share one (the same dump
    given twice): GPUs are told apart by bus id, as on a real machine."""
    seen: set[str] = set()
    out = []
    for p in profiles:
        bus = p.pci_bus_id.upper()
        m = re.match(r"^([0-9A-F]{8}):([0-9A-F]{2}):([0-9A-F]{2})\.([0-7])$", bus)
        while bus in seen:
            if not m:
                bus = f"00000000:{len(seen) + 1:02X}:00.0"
                m = re.match(r"^([0-9A-F]{8}):([0-9A-F]{2}):([0-9A-F]{2})\.([0-7])$", bus)
                continue
            dom, b, dev, fn = m.groups()
            bus = f"{dom}:{(int(b, 16) + 1) % 256:02X}:{dev}.{fn}"
            m = re.match(r"^([0-9A-F]{8}):([0-9A-F]{2}):([0-9A-F]{2})\.([0-7])$", bus)
        seen.add(bus)
        out.append(bus)
    return out


class StateFile:
    """The JSON file shared by every process using the same fake GPUs; writes are atomic (rename)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None

    def changed(self) -> bool:
        """True when another writer changed the file since this object last read or wrote it."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return self._key(st) != self._seen

    @staticmethod
    def _key(st: os.stat_result) -> tuple[int, int, int]:
        return (st.st_ino, st.st_mtime_ns, st.st_size)  # every write is a new file (rename): a new inode

    def read(self) -> dict[str, Any]:
        """The file's content. Raises OSError, ValueError (not JSON or wrong format)."""
        with open(self.path, encoding="utf-8") as f:
            key = self._key(os.fstat(f.fileno()))
            data = json.loads(f.read())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{self.path}: not a fake NVML state file (format {FORMAT!r})")
        self._seen = key
        return data

    def write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data))
            f.flush()
            key = self._key(os.fstat(f.fileno()))
        os.replace(tmp, self.path)
        self._seen = key


def dump_state(
    gpus: list[FakeGpu], *, driver_version: str, privileged: bool, missing: list[str]
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "driver_version": driver_version,
        "privileged": privileged,
        "missing_functions": sorted(missing),
        "gpus": [
            {
                "profile": profile_to_dict(g.profile),
                "bus_id": g.bus_id,
                "uuid": g.uuid,
                **g.control(),
                "dynamic": g.dynamic(),
            }
            for g in gpus
        ],
    }


def load_gpus(data: dict[str, Any]) -> list[FakeGpu]:
    """GPUs rebuilt from a state file's content (control and dynamic values included)."""
    gpus = []
    for d in data["gpus"]:
        g = FakeGpu(profile=profile_from_dict(d["profile"]), bus_id=d["bus_id"], uuid=d["uuid"])
        g.apply_control(d)
        for k, v in d.get("dynamic", {}).items():
            setattr(g, k, v)
        gpus.append(g)
    return gpus
