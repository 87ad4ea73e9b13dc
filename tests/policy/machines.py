"""Test machines built from the shared model types: GPUs, a Super I/O chip with pwm fans, k10temp, RAPL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aithermd.model import Channel, Device, DeviceKind, Knob, KnobKind, KnobValue, Quantity, Reading, Status
from aithermd.policy.engine import EngineInput

NCT = "hwmon:nct6798-isa-0290"
K10 = "hwmon:k10temp-pci-00c3"
PKG = "powercap:package-0"


def gpu(i: int, *, name: str = "NVIDIA GeForce RTX 4090", min_w: float = 150.0, max_w: float = 600.0,
        default_w: float = 450.0, slowdown: float | None = 90.0, shutdown: float | None = 95.0,
        fans: int = 1, uuid: str | None = None) -> Device:
    dev = f"gpu{i}"
    th = {k: v for k, v in (("slowdown", slowdown), ("shutdown", shutdown)) if v is not None}
    chans = (Channel(f"{dev}/temperature", dev, "temperature", Quantity.TEMPERATURE, "°C", thresholds=th),
             Channel(f"{dev}/utilization", dev, "utilization", Quantity.UTILIZATION, "%"),
             Channel(f"{dev}/memory_utilization", dev, "memory_utilization", Quantity.UTILIZATION, "%"),
             Channel(f"{dev}/power", dev, "power", Quantity.POWER, "W"))
    knobs = (Knob(f"{dev}/power_limit", dev, KnobKind.POWER_LIMIT, "W", min_w, max_w, default_w, True),
             *(Knob(f"{dev}/fan{j}", dev, KnobKind.FAN, "%", 0.0, 100.0, None, True) for j in range(fans)))
    return Device(dev, DeviceKind.GPU, name, chans, knobs, info={"uuid": uuid or f"GPU-{i:08d}-test"})


def datacenter_gpu(i: int) -> Device:
    return gpu(i, name="NVIDIA H100 80GB HBM3", min_w=200.0, max_w=700.0, default_w=700.0, fans=0,
               slowdown=None, shutdown=92.0)


def nct() -> Device:
    chans = tuple(Channel(f"{NCT}/fan{n}", NCT, f"fan{n}", Quantity.FAN, "RPM", label=lab)
                  for n, lab in ((1, "CPU_FAN"), (2, "CHA_FAN1")))
    chans += (Channel(f"{NCT}/temp1", NCT, "temp1", Quantity.TEMPERATURE, "°C", label="SYSTIN",
                      thresholds={"crit": 100.0}),)
    knobs = tuple(Knob(f"{NCT}/pwm{n}", NCT, KnobKind.PWM, "%", 0.0, 100.0, None, True, fan_channel=f"{NCT}/fan{n}")
                  for n in (1, 2))
    return Device(NCT, DeviceKind.HWMON, "nct6798", chans, knobs, chip="nct6798-isa-0290")


def k10temp(crit: float | None = None) -> Device:
    th = {"crit": crit} if crit is not None else {}
    return Device(K10, DeviceKind.HWMON, "k10temp", (
        Channel(f"{K10}/temp1", K10, "temp1", Quantity.TEMPERATURE, "°C", label="Tctl", thresholds=th),),
        chip="k10temp-pci-00c3")


def rapl() -> Device:
    return Device(PKG, DeviceKind.POWERCAP, "package-0",
                  (Channel(f"{PKG}/power", PKG, "power", Quantity.POWER, "W"),),
                  (Knob(f"{PKG}/pl1", PKG, KnobKind.PL1, "W", 10.0, 250.0, 125.0, True),
                   Knob(f"{PKG}/pl2", PKG, KnobKind.PL2, "W", 10.0, 300.0, 180.0, True)))


def cpu() -> Device:
    return Device("cpu", DeviceKind.CPU, "cpu",
                  (Channel("cpu/utilization", "cpu", "utilization", Quantity.UTILIZATION, "%"),))


def workstation(n_gpus: int = 2) -> tuple[Device, ...]:
    return (*(gpu(i) for i in range(n_gpus)), nct(), k10temp(), rapl(), cpu())


def tick(devices: Sequence[Device], t: float, values: Mapping[str, float | None | Status], *,
         knobs: Mapping[str, float] | None = None, t_wall: float | None = None,
         processes: frozenset[str] = frozenset(), fan_alarms: Mapping[str, str] | None = None) -> EngineInput:
    """An EngineInput: ``values`` by channel id (a Status instead of a number makes that reading fail)."""
    readings = {}
    for cid, v in values.items():
        if isinstance(v, Status):
            readings[cid] = Reading(cid, None, v, "injected")
        else:
            readings[cid] = Reading(cid, v)
    kv = {k: KnobValue(k, v) for k, v in (knobs or {}).items()}
    return EngineInput(t_mono=t, t_wall=1_760_000_000.0 + t if t_wall is None else t_wall,
                       devices=tuple(devices), readings=readings, knobs=kv, processes=processes,
                       fan_alarms=dict(fan_alarms or {}))


def gpu_values(i: int, util: float, power: float, temp: float = 50.0) -> dict[str, float]:
    return {f"gpu{i}/utilization": util, f"gpu{i}/power": power, f"gpu{i}/temperature": temp}
