"""NvmlBackend over the fake NVML: every field, every error class, limits, fans, worker thread."""

from __future__ import annotations

import asyncio
import math
import threading

import pynvml
import pytest

from aithermd.backends.base import Backend
from aithermd.backends.nvml import NvmlBackend, open_from_locator
from aithermd.backends.nvml_gpu import GpuReader
from aithermd.errors import DeviceLost, NoPermission, NotSupported, OutOfRange, UnknownKnob
from aithermd.model import DeviceKind, KnobKind, Quantity, Status
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import A6000, DUMPS, H100, RTX4090, profile

E = pynvml


def test_discovery_names_every_channel_knob_and_field(workstation, backend_over):
    backend = backend_over(workstation)
    assert isinstance(backend, Backend) and backend.kind == "nvml"
    rtx, h100 = backend.discover()
    assert (rtx.id, rtx.kind, rtx.name) == ("gpu0", DeviceKind.GPU, "NVIDIA GeForce RTX 4090")
    assert rtx.info["pci_bus_id"] == "00000000:01:00.0" and rtx.info["uuid"] == workstation.gpus[0].uuid
    assert [c.attribute for c in rtx.channels] == [
        "temperature",
        "power",
        "energy",
        "utilization",
        "memory_utilization",
        "sm_clock",
        "memory_clock",
        "fan0",
        "fan1",
    ]
    assert [c.attribute for c in h100.channels][:4] == [
        "temperature",
        "memory_temperature",
        "power",
        "energy",
    ]
    units = {c.attribute: (c.quantity, c.unit) for c in h100.channels}
    assert units["power"] == (Quantity.POWER, "W") and units["energy"] == (Quantity.ENERGY, "J")
    assert units["sm_clock"] == (Quantity.CLOCK, "MHz") and units["memory_temperature"][1] == "°C"
    temp = rtx.channels[0]
    assert temp.id == "gpu0/temperature"
    assert dict(temp.thresholds) == {"slowdown": 86.0, "shutdown": 91.0, "max_operating": 84.0}
    limit, fan0, fan1, lock = rtx.knobs
    assert (limit.id, limit.kind, limit.unit) == ("gpu0/power_limit", KnobKind.POWER_LIMIT, "W")
    # the locked SM clock range's top: from the lowest listed graphics clock up to the card's top (unlocked)
    assert (lock.id, lock.kind, lock.unit) == ("gpu0/sm_clock_lock", KnobKind.SM_CLOCK_LOCK, "MHz")
    assert (lock.min, lock.max, lock.default, lock.writable) == (210.0, 3105.0, 3105.0, True)
    assert (limit.min, limit.max, limit.default, limit.writable) == (150.0, 450.0, 450.0, True)
    assert (fan0.id, fan0.kind, fan0.fan_channel, fan0.min, fan0.max) == (
        "gpu0/fan0",
        KnobKind.FAN,
        "gpu0/fan0",
        0.0,
        100.0,
    )
    assert fan1.writable
    assert [k.id for k in h100.knobs] == ["gpu1/power_limit", "gpu1/sm_clock_lock"], \
        "a passively cooled GPU has no fan knob"


def test_one_sample_reads_every_value_in_daemon_units(workstation, backend_over):
    workstation.set_dynamic(
        1,
        temp_c=62,
        memory_temp_c=71,
        power_draw_w=612.5,
        gpu_util_pct=100,
        memory_util_pct=35,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        clock_event_reasons=("sw_power_cap",),
        gpm_tensor_pct=40.0,
    )
    backend = backend_over(workstation)  # discovery takes the first GPM sample of the H100
    workstation.add_energy(1, 3600.0, dt_s=1.0)  # one second of it drawing and computing
    workstation.set_dynamic(0, fan_speed_pct=[55, 60])
    s = backend.sample()
    r = {k: v.value for k, v in s.readings.items()}
    assert (r["gpu1/temperature"], r["gpu1/memory_temperature"], r["gpu1/power"]) == (62.0, 71.0, 612.5)
    assert (r["gpu1/energy"], r["gpu1/utilization"], r["gpu1/memory_utilization"]) == (3600.0, 100.0, 35.0)
    assert (r["gpu1/sm_clock"], r["gpu1/memory_clock"]) == (1980.0, 2619.0)
    assert (r["gpu0/fan0"], r["gpu0/fan1"], r["gpu0/power"]) == (55.0, 60.0, 20.0)
    assert r["gpu1/tensor_activity"] == pytest.approx(40.0) and "gpu0/tensor_activity" not in r  # GPM: Hopper
    assert all(v.status == Status.OK for v in s.readings.values())
    assert s.attrs["gpu1"] == {
        "clock_event_reasons": ("sw_power_cap",),
        "persistence_mode": True,
        "pstate": "P0",
    }
    assert s.attrs["gpu0"]["clock_event_reasons"] == ("gpu_idle",)
    pl = s.knobs["gpu1/power_limit"]
    assert (pl.value, pl.mode, dict(pl.extra)) == (700.0, None, {"enforced_w": 700.0})
    assert (s.knobs["gpu0/fan1"].value, s.knobs["gpu0/fan1"].mode) == (60.0, "auto")
    assert s.lost == frozenset()


def test_not_supported_capabilities_are_absent(backend_over):
    mig = profile(DUMPS / "h100-mig-enabled-nvidia-smi-q-idle-and-load.txt")  # utilization N/A under MIG
    windows = profile(DUMPS / "rtx-a6000-nvidia-smi-q-windows-idle.txt")  # persistence mode N/A
    backend = backend_over(FakeNvml([mig, windows]))
    a, b = backend.discover()
    assert "utilization" not in {c.attribute for c in a.channels}
    assert "fan0" not in {c.attribute for c in a.channels} and "memory_temperature" in {
        c.attribute for c in a.channels
    }
    assert "memory_temperature" not in {c.attribute for c in b.channels}
    s = backend.sample()
    assert "persistence_mode" not in s.attrs["gpu1"] and s.attrs["gpu0"]["persistence_mode"] is True


def test_no_permission_makes_knobs_read_only_with_the_reason(backend_over):
    fake = FakeNvml([profile(RTX4090)], privileged=False)
    backend = backend_over(fake)
    (gpu,) = backend.discover()
    limit, fan, lock = gpu.knobs
    assert not limit.writable and limit.why_not.startswith("NVML_ERROR_NO_PERMISSION")
    assert not fan.writable and "NVML_ERROR_NO_PERMISSION" in fan.why_not
    assert not lock.writable and "NVML_ERROR_NO_PERMISSION" in lock.why_not
    with pytest.raises(NoPermission):
        backend.write_knob("gpu0/sm_clock_lock", 1500)
    with pytest.raises(NoPermission):
        backend.write_knob("gpu0/power_limit", 300)
    assert fake.power_limit_w(0) == 450.0
    loose = backend_over(fake, probe_writes=False)  # NVML itself refuses when nothing was probed
    assert loose.discover()[0].knobs[0].writable
    with pytest.raises(NoPermission, match="NVML_ERROR_NO_PERMISSION"):
        loose.write_knob("gpu0/power_limit", 300)


def test_a_lost_gpu_is_reported_and_the_others_keep_working(workstation, backend_over):
    backend = backend_over(workstation)
    workstation.inject("nvmlDeviceGetFieldValues", 0, E.NVML_ERROR_GPU_IS_LOST)
    s = backend.sample()
    assert s.lost == frozenset({"gpu0"})
    lost = [v for k, v in s.readings.items() if k.startswith("gpu0/")]
    assert lost and all(v.status == Status.FAILED and v.detail.startswith("NVML_ERROR_GPU_IS_LOST (PCI ")
                        for v in lost)
    assert s.knobs["gpu0/power_limit"].status == Status.FAILED
    assert s.readings["gpu1/temperature"].value == 41.0 and s.knobs["gpu1/power_limit"].value == 700.0
    with pytest.raises(DeviceLost):
        backend.write_knob("gpu0/power_limit", 300)
    again = backend_over(workstation)  # lost at discovery: not ready yet, the rest found
    (found,) = again.discover()
    assert (found.id, found.name) == ("gpu1", "NVIDIA H100 80GB HBM3"), "ids stay the NVML index"
    assert again.sample().health["nvml"]["expected"] == 2  # the unready GPU is expected, not present


def test_transient_and_runtime_errors_mark_single_readings(workstation, backend_over):
    backend = backend_over(workstation)
    workstation.inject("nvmlDeviceGetTemperatureV", 1, E.NVML_ERROR_TIMEOUT, count=1)
    workstation.inject("nvmlDeviceGetUtilizationRates", 1, E.NVML_ERROR_NOT_SUPPORTED, count=1)
    s = backend.sample()
    t, u = s.readings["gpu1/temperature"], s.readings["gpu1/utilization"]
    assert (t.value, t.status, t.detail) == (None, Status.FAILED, "NVML_ERROR_TIMEOUT")
    assert (u.status, s.readings["gpu1/memory_utilization"].status) == (
        Status.NOT_SUPPORTED,
        Status.NOT_SUPPORTED,
    )
    assert s.readings["gpu1/power"].status == Status.OK and s.lost == frozenset()
    assert backend.sample().readings["gpu1/temperature"].value == 41.0, "the next sample is fine"
    workstation.inject("nvmlDeviceGetFieldValues", 1, E.NVML_ERROR_TIMEOUT, count=1)
    s = backend.sample()
    assert s.readings["gpu1/power"].detail == "NVML_ERROR_TIMEOUT" and s.readings["gpu1/energy"].value is None
    assert s.knobs["gpu1/power_limit"].status == Status.FAILED
    workstation.set_dynamic(1, temp_c=255)  # an all-ones register
    assert backend.sample().readings["gpu1/temperature"].status == Status.IMPLAUSIBLE


def test_old_driver_falls_back_to_the_older_calls(backend_over):
    # driver 530: no nvmlDeviceGetTemperatureV, no ClocksEventReasons, no power fields
    fake = FakeNvml([profile(DUMPS / "rtx4090-nvidia-smi-q-x-driver535.xml")], driver_version="530.41.03")
    backend = backend_over(fake)
    fake.inject("nvmlDeviceGetCurrentClocksThrottleReasons", 0, E.NVML_ERROR_TIMEOUT, count=1)
    fake.inject("nvmlDeviceGetTemperature", 0, E.NVML_ERROR_TIMEOUT, count=1)
    fake.inject("nvmlDeviceGetPowerUsage", 0, E.NVML_ERROR_TIMEOUT, count=1)
    s = backend.sample()
    assert s.readings["gpu0/temperature"].detail == "NVML_ERROR_TIMEOUT", "read through the legacy call"
    assert s.readings["gpu0/power"].detail == "NVML_ERROR_TIMEOUT", "read through nvmlDeviceGetPowerUsage"
    assert "clock_event_reasons" not in s.attrs["gpu0"], "read through the throttle-reasons call"
    s = backend.sample()
    assert s.attrs["gpu0"]["clock_event_reasons"] == ("gpu_idle",)
    assert (s.readings["gpu0/temperature"].value, s.readings["gpu0/power"].value) == (40.0, 26.84)
    assert s.knobs["gpu0/power_limit"].extra["enforced_w"] == 450.0
    old = backend_over(FakeNvml([profile(DUMPS / "gtx1660ti-nvidia-smi-q-x.xml")]))  # driver 418
    (gpu,) = old.discover()
    (fan,) = [k for k in gpu.knobs if k.kind == KnobKind.FAN]
    assert not fan.writable and fan.why_not.startswith("NVML_ERROR_FUNCTION_NOT_FOUND")
    s = old.sample()
    assert s.attrs["gpu0"]["clock_event_reasons"] == ("gpu_idle",) and s.readings["gpu0/fan0"].value == 0.0
    with pytest.raises(NotSupported):
        old.write_knob("gpu0/fan0", 50)


def test_no_driver_means_zero_gpus_not_an_error(backend_over, monkeypatch):
    backend = backend_over(FakeNvml([profile(A6000)], driver_loaded=False))
    assert backend.discover() == [] and backend.unavailable == "NVML_ERROR_DRIVER_NOT_LOADED"
    assert backend.sample().readings == {}
    real = FakeNvml().bindings()  # a private copy of the real bindings with no library loaded
    real.nvmlLib = None

    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(real, "CDLL", no_library)
    bare = NvmlBackend(nvml=real)
    try:
        assert bare.discover() == [] and bare.unavailable == "NVML_ERROR_LIBRARY_NOT_FOUND"
    finally:
        bare.close()


def test_power_limit_writes_in_watts_within_the_constraints(workstation, backend_over):
    backend = backend_over(workstation)
    backend.write_knob("gpu0/power_limit", 312.5)
    assert workstation.gpus[0].limit_mw == 312500
    kv = backend.read_knob("gpu0/power_limit")
    assert (kv.value, kv.extra["enforced_w"]) == (312.5, 312.5)
    for bad in (149.0, 450.5, math.nan, -1.0):
        with pytest.raises(OutOfRange):
            backend.write_knob("gpu0/power_limit", bad)
    assert workstation.power_limit_w(0) == 312.5, "a refused value never reaches NVML"
    workstation.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_INVALID_ARGUMENT, count=1)
    with pytest.raises(OutOfRange, match="NVML_ERROR_INVALID_ARGUMENT"):  # a raise the driver refuses (a cut
        backend.write_knob("gpu0/power_limit", 400)  # it refuses goes as deep as it takes: test_write_faults)
    with pytest.raises(UnknownKnob):
        backend.write_knob("gpu0/pl1", 100)
    with pytest.raises(UnknownKnob):
        backend.write_knob("gpu7/power_limit", 100)


def test_save_and_restore_the_power_limit(workstation, backend_over):
    backend = backend_over(workstation)
    saved = backend.save_knob("gpu1/power_limit")
    assert saved == {"limit_mw": 700000, "uuid": workstation.gpu(1).uuid}
    backend.write_knob("gpu1/power_limit", 250)
    backend.restore_knob("gpu1/power_limit", saved)
    assert workstation.power_limit_w(1) == 700.0


def test_fan_control_and_return_to_automatic(workstation, backend_over):
    backend = backend_over(workstation)
    saved = backend.save_knob("gpu0/fan1")
    assert saved == {"speed_pct": 0, "mode": "auto", "uuid": workstation.gpu(0).uuid}
    backend.write_knob("gpu0/fan1", 72.4)
    assert (workstation.fan_target_pct(0, 1), workstation.fan_auto(0, 1)) == (72, False)
    kv = backend.read_knob("gpu0/fan1")
    assert (kv.value, kv.mode) == (72.0, "manual")
    assert workstation.fan_auto(0, 0), "the other fan stays automatic"
    with pytest.raises(OutOfRange):
        backend.write_knob("gpu0/fan1", 101)
    workstation.set_dynamic(0, fan_speed_pct=38)
    backend.restore_knob("gpu0/fan1", saved)
    assert workstation.fan_auto(0, 1) and backend.read_knob("gpu0/fan1").value == 38.0
    backend.write_knob("gpu0/fan0", 90)
    manual = backend.save_knob("gpu0/fan0")
    backend.set_fan_auto("gpu0/fan0")
    assert workstation.fan_auto(0, 0)
    backend.restore_knob("gpu0/fan0", manual)
    assert (workstation.fan_auto(0, 0), workstation.fan_target_pct(0, 0)) == (False, 90)


def test_locator_and_reopening(tmp_path, backend_over):
    plain = backend_over(FakeNvml([profile(H100)]))
    assert plain.locator() == {"backend": "nvml"}
    fake = FakeNvml([profile(H100)], state_path=tmp_path / "gpus.json")
    backend = backend_over(fake)
    loc = backend.locator()
    assert loc == {"backend": "nvml", "fake_state": str(tmp_path / "gpus.json")}
    again = open_from_locator(loc)
    try:
        (dev,) = again.discover()
        assert dev.info["uuid"] == fake.gpus[0].uuid
    finally:
        again.close()


async def test_every_nvml_call_runs_on_the_worker_thread(workstation, backend_over, monkeypatch):
    backend = backend_over(workstation)
    seen: set[str] = set()
    read = GpuReader.read

    def spy(self, *args):
        seen.add(threading.current_thread().name)
        return read(self, *args)

    monkeypatch.setattr(GpuReader, "read", spy)
    sample = await asyncio.to_thread(backend.sample)  # the daemon samples from its worker thread
    assert sample.readings["gpu1/power"].value == 69.85
    backend.sample()
    assert len(seen) == 1 and next(iter(seen)).startswith("nvml")
    assert threading.current_thread().name not in seen
    devices = await backend.adiscover()
    assert [d.id for d in devices] == ["gpu0", "gpu1"]


def test_every_clock_event_reason_bit_decodes_to_its_name(workstation, backend_over):
    from aithermd.sim.fake_nvml_state import REASON_BITS

    backend = backend_over(workstation)
    workstation.set_dynamic(1, clock_event_reasons=tuple(REASON_BITS))
    assert set(backend.sample().attrs["gpu1"]["clock_event_reasons"]) == set(REASON_BITS)
    for name, bit in REASON_BITS.items():  # each bit alone: the name comes from the bindings' constants
        workstation.set_dynamic(1, clock_event_reasons=bit)
        assert backend.sample().attrs["gpu1"]["clock_event_reasons"] == (name,)
    workstation.set_dynamic(1, clock_event_reasons=0)
    assert backend.sample().attrs["gpu1"]["clock_event_reasons"] == ()


def test_a_gpu_die_reading_0_c_is_implausible(workstation, backend_over):
    """attack4 B6: an NVML temperature stuck at 0 °C was a reading like any other: one confirming read and
    the critical cut of a hot GPU ramped back to its maximum. A die is never at 0 °C on a working machine."""
    backend = backend_over(workstation)
    workstation.set_dynamic(1, temp_c=0)
    r = backend.sample().readings["gpu1/temperature"]
    assert (r.status, r.value, r.detail) == (Status.IMPLAUSIBLE, None, "0 °C out of range")
    workstation.set_dynamic(1, temp_c=1)
    assert backend.sample().readings["gpu1/temperature"].value == 1.0


def test_a_power_reading_over_twice_the_cards_highest_limit_is_implausible(workstation, backend_over):
    """attack8 T7: any GPU power reading up to 5 kW was taken: one 10× sample made the efficient search's
    peak 2.5 kW and skewed the power budget for 8 s. No card draws twice its highest limit (the energy
    counter's ceiling, backends/energy_rate.py): this RTX 4090 dump's 450 W → 900 W."""
    backend = backend_over(workstation)
    assert backend.sample().readings["gpu0/power"].status == Status.OK
    workstation.set_dynamic(0, power_draw_w=950.0)
    r = backend.sample().readings["gpu0/power"]
    assert (r.status, r.value, r.detail) == (Status.IMPLAUSIBLE, None, "950 W out of range")
    workstation.set_dynamic(0, power_draw_w=880.0)  # a transient over the limit is still a reading
    assert backend.sample().readings["gpu0/power"].value == 880.0
