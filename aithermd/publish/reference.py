"""A synthetic reference workstation as published snapshots: the workload of the publishing benchmarks.

Two GPUs (``gpu0``, ``gpu1`` with uuid, power limit and fan knobs, energy counters), one Super I/O chip
(``hwmon:nct6798-isa-0290``: 3 fans with pwm knobs, 3 temperatures), a CPU temperature chip
(``hwmon:k10temp-pci-00c3``: 3 temperatures) and two RAPL zones (``powercap:package-0`` with PL1/PL2,
``powercap:dram``). Values move with ``seq`` so counters grow and gauges change; everything is in daemon
units (°C, W, J, %, RPM). Used by ``benchmarks/`` and by the tests of :mod:`aithermd.publish`.
"""

from __future__ import annotations

from types import MappingProxyType

from aithermd.model import (
    Channel,
    Decision,
    Device,
    DeviceKind,
    Hold,
    Knob,
    KnobKind,
    KnobValue,
    Layer,
    PolicyStatus,
    Quantity,
    Reading,
    Snapshot,
    Status,
)


def _ch(dev: str, attr: str, q: Quantity, label: str | None = None, **thr: float) -> Channel:
    unit = {Quantity.TEMPERATURE: "°C", Quantity.FAN: "RPM", Quantity.POWER: "W", Quantity.ENERGY: "J",
            Quantity.UTILIZATION: "%", Quantity.CLOCK: "MHz"}[q]
    return Channel(f"{dev}/{attr}", dev, attr, q, unit, label, MappingProxyType(thr))


def reference_devices(gpus: int = 2) -> tuple[Device, ...]:
    """The devices of the reference workstation (see the module docstring)."""
    devices: list[Device] = []
    for i in range(gpus):
        d = f"gpu{i}"
        devices.append(Device(
            d, DeviceKind.GPU, "NVIDIA GeForce RTX 4090",
            channels=(_ch(d, "temperature", Quantity.TEMPERATURE, slowdown=87.0, shutdown=92.0),
                      _ch(d, "memory_temperature", Quantity.TEMPERATURE),
                      _ch(d, "power", Quantity.POWER), _ch(d, "energy", Quantity.ENERGY),
                      _ch(d, "utilization", Quantity.UTILIZATION), _ch(d, "sm_clock", Quantity.CLOCK)),
            knobs=(Knob(f"{d}/power_limit", d, KnobKind.POWER_LIMIT, "W", 150.0, 600.0, 450.0, True),
                   Knob(f"{d}/fan0", d, KnobKind.FAN, "%", 30.0, 100.0, None, True)),
            info=MappingProxyType({"uuid": f"GPU-1a2b3c4d-0000-4000-8000-00000000000{i}",
                                   "pci_bus_id": f"00000000:0{i + 1}:00.0"})))
    sio = "hwmon:nct6798-isa-0290"
    devices.append(Device(
        sio, DeviceKind.HWMON, "nct6798", chip="nct6798-isa-0290",
        channels=tuple(_ch(sio, f"fan{n}", Quantity.FAN, label) for n, label in
                       ((1, None), (2, "CPU fan"), (3, None)))
        + tuple(_ch(sio, f"temp{n}", Quantity.TEMPERATURE, label, max=80.0) for n, label in
                ((1, "SYSTIN"), (2, "CPUTIN"), (3, "AUXTIN0"))),
        knobs=tuple(Knob(f"{sio}/pwm{n}", sio, KnobKind.PWM, "%", 0.0, 100.0, None, True,
                         fan_channel=f"{sio}/fan{n}") for n in (1, 2, 3))))
    k10 = "hwmon:k10temp-pci-00c3"
    devices.append(Device(
        k10, DeviceKind.HWMON, "k10temp", chip="k10temp-pci-00c3",
        channels=tuple(_ch(k10, f"temp{n}", Quantity.TEMPERATURE, label) for n, label in
                       ((1, "Tctl"), (3, "Tccd1"), (4, "Tccd2")))))
    pkg = "powercap:package-0"
    devices.append(Device(
        pkg, DeviceKind.POWERCAP, "package-0",
        channels=(_ch(pkg, "power", Quantity.POWER), _ch(pkg, "energy", Quantity.ENERGY)),
        knobs=(Knob(f"{pkg}/pl1", pkg, KnobKind.PL1, "W", 10.0, 253.0, 125.0, True),
               Knob(f"{pkg}/pl2", pkg, KnobKind.PL2, "W", 10.0, 253.0, 253.0, True)),
        info={"zone": "intel-rapl:0", "parent": None, "role": "package"}))
    dram = "powercap:dram"
    devices.append(Device(dram, DeviceKind.POWERCAP, "dram", channels=(
        _ch(dram, "power", Quantity.POWER), _ch(dram, "energy", Quantity.ENERGY)),
        info={"zone": "intel-rapl:0:2", "parent": pkg, "role": "dram", "in_total": False}))
    return tuple(devices)


def reference_snapshot(seq: int = 1, *, gpus: int = 2, tick_s: float = 1.0, t0_mono: float = 1000.0,
                       t0_wall: float = 1_767_225_600.0, active: str = "balanced",
                       holds: tuple[Hold, ...] = ()) -> Snapshot:
    """The reference workstation at tick ``seq`` (time ``t0 + seq * tick_s``)."""
    devices = reference_devices(gpus)
    t = seq * tick_s
    readings: dict[str, Reading] = {}
    knobs: dict[str, KnobValue] = {}
    attrs: dict[str, dict[str, object]] = {}
    decisions: dict[str, Decision] = {}
    for dev in devices:
        for ch in dev.channels:
            readings[ch.id] = Reading(ch.id, _value(ch, seq, t))
        for k in dev.knobs:
            value = (k.default or 50.0) if k.kind is not KnobKind.FAN else 40.0 + seq % 10
            extra = MappingProxyType({"enforced_w": value} if k.kind is KnobKind.POWER_LIMIT else {})
            knobs[k.id] = KnobValue(k.id, value, mode="manual", status=Status.OK, extra=extra)
            decisions[k.id] = Decision(k.id, value, Layer.POLICY, f"{active}/{k.kind.value}",
                                       f"{k.kind.value} follows {active}", requested=value)
        if dev.kind is DeviceKind.GPU:
            attrs[dev.id] = {"clock_event_reasons": ("sw_power_cap",) if seq % 2 else (), "pstate": "P2"}
    return Snapshot(
        seq=seq, t_mono=t0_mono + t, t_wall=t0_wall + t, devices=devices, readings=MappingProxyType(readings),
        knobs=MappingProxyType(knobs), attrs=MappingProxyType(attrs), decisions=MappingProxyType(decisions),
        policy=PolicyStatus(active, holds, MappingProxyType({active: MappingProxyType({"gpu0": "idle"})})),
        tick_s=tick_s)


def _value(ch: Channel, seq: int, t: float) -> float:
    wobble = (seq * 7 + len(ch.id)) % 5
    if ch.quantity is Quantity.TEMPERATURE:
        return 40.0 + wobble
    if ch.quantity is Quantity.FAN:
        return 900.0 + 10 * wobble
    if ch.quantity is Quantity.POWER:
        return 100.0 + wobble
    if ch.quantity is Quantity.ENERGY:
        return 1000.0 + 100.0 * t  # 100 W on every energy counter
    if ch.quantity is Quantity.UTILIZATION:
        return 50.0 + wobble
    return 1500.0 + wobble
