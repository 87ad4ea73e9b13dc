"""A GPU described by what ``nvidia-smi -q`` printed for it: the input of the fake NVML, the replay and
the simulator. Values are in daemon units (W, °C, %, MHz, MiB); None where the dump said N/A or had no
such field."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuProcessInfo:
    """One entry of a dump's ``Processes`` section: ``type`` is ``"C"`` (compute), ``"G"`` (graphics) or
    ``"C+G"`` (both lists); ``used_memory_mib`` None where the dump said N/A (Windows WDDM); MIG instance ids
    None where N/A (MIG off)."""

    pid: int
    type: str = "C"
    name: str = ""
    used_memory_mib: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """The dynamic values of one ``-q`` capture of a GPU (dumps may hold several: idle, then load).
    ``label`` is the capture's comment label ("idle", "load") or "" when the dump has none."""

    label: str = ""
    temp_c: float | None = None
    memory_temp_c: float | None = None
    power_draw_w: float | None = None
    gpu_util_pct: float | None = None
    memory_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    fan_speed_pct: float | None = None
    pstate: str | None = None
    clock_event_reasons: tuple[str, ...] = ()
    processes: tuple[GpuProcessInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str  # "NVIDIA GeForce RTX 4090"; "" when the dump has no product name (-d POWER,CLOCK)
    pci_bus_id: str  # "00000000:01:00.0"
    uuid: str | None = None  # None when masked (all zeros): the fake NVML derives a stable one
    serial: str | None = None
    architecture: str | None = None
    driver_version: str | None = None
    # power (W)
    power_limit_w: float | None = None  # current management limit
    enforced_power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    min_power_limit_w: float | None = None
    max_power_limit_w: float | None = None
    power_draw_w: float | None = None
    # temperatures (°C)
    temp_c: float | None = None
    memory_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    slowdown_temp_c: float | None = None
    max_operating_temp_c: float | None = None
    memory_max_temp_c: float | None = None
    target_temp_c: float | None = None
    # utilization (%), clocks (MHz), memory (MiB)
    gpu_util_pct: float | None = None
    memory_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    max_memory_clock_mhz: float | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    # fans (%); empty for passively cooled boards
    fan_speeds_pct: tuple[float, ...] = ()
    persistence_mode: bool | None = None
    pstate: str | None = None
    source: str = ""  # the dump's file name, for messages
    extra: dict[str, str] = field(default_factory=dict)
    # absolute T.Limit (°C) where the dump gives thresholds relative to it (Ada/Hopper, driver ≥ 535);
    # slowdown/shutdown/max_operating above are then already converted to absolute °C
    tlimit_temp_c: float | None = None
    # active clock-event (throttle) reasons of the first capture: "gpu_idle", "sw_power_cap", ...
    clock_event_reasons: tuple[str, ...] = ()
    # every capture of this GPU in the dump, in file order (the first one is what the fields above hold)
    snapshots: tuple[GpuSnapshot, ...] = ()
    # the first capture's Processes section (each capture's own is in its snapshot)
    processes: tuple[GpuProcessInfo, ...] = ()
