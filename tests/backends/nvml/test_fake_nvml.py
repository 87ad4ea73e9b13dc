"""The fake NVML through the real pynvml bindings: units, constraints, return codes, injection, install."""

from __future__ import annotations

import ctypes
import re

import pynvml
import pytest

from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import A6000, DUMPS, H100, RTX4090, profile


@pytest.fixture
def nv(workstation):
    module = workstation.bindings()
    module.nvmlInit()
    return module


def test_nothing_answers_before_init(workstation):
    module = workstation.bindings()
    with pytest.raises(module.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()
    module.nvmlInit()
    module.nvmlShutdown()
    with pytest.raises(module.NVMLError_Uninitialized):
        module.nvmlDeviceGetHandleByIndex(0)


def test_identity_and_pci(nv, workstation):
    assert nv.nvmlDeviceGetCount() == 2
    assert nv.nvmlSystemGetDriverVersion() == "590.48.01"
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetName(h0) == "NVIDIA GeForce RTX 4090"
    assert nv.nvmlDeviceGetName(h1) == "NVIDIA H100 80GB HBM3"
    pci = nv.nvmlDeviceGetPciInfo_v3(h1)
    assert (pci.busId, pci.domain, pci.bus, pci.device) == ("00000000:00:09.0", 0, 0, 9)
    assert pci.pciDeviceId == 0x233010DE
    uuids = [nv.nvmlDeviceGetUUID(h) for h in (h0, h1)]
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids
    )
    assert len(set(uuids)) == 2 and "GPU-00000000" not in uuids[0]
    assert nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByUUID(uuids[1].encode())) == "NVIDIA H100 80GB HBM3"
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(2)


def test_the_uuid_is_stable_across_instances_and_unique_for_a_repeated_dump():
    a = FakeNvml([profile(RTX4090), profile(RTX4090)])
    b = FakeNvml([profile(RTX4090)])
    assert a.gpus[0].uuid == b.gpus[0].uuid
    assert a.gpus[0].bus_id == "00000000:01:00.0" and a.gpus[1].bus_id == "00000000:02:00.0"
    assert a.gpus[0].uuid != a.gpus[1].uuid


def test_readings_in_nvml_units(nv, workstation):
    h = nv.nvmlDeviceGetHandleByIndex(1)  # H100 idle: 41 °C, 69.85 W, HBM 48 °C
    assert nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU) == 41
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == 41
    assert nv.nvmlDeviceGetPowerUsage(h) == 69850  # mW
    assert nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 95
    assert nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
    assert nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == 87
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    workstation.add_energy(1, 12.5)
    assert nv.nvmlDeviceGetTotalEnergyConsumption(h) == 12500  # mJ
    util = nv.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (0, 0)
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) == 345
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) == 2619
    assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) == 1980
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == nv.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetPersistenceMode(h) == nv.NVML_FEATURE_ENABLED
    assert nv.nvmlDeviceGetPerformanceState(h) == 0
    assert nv.nvmlDeviceGetMemoryInfo(h).total == 81559 * 2**20
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 700000
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700000
    assert nv.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700000
    assert nv.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]
    assert nv.nvmlDeviceGetNumFans(h) == 0
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetFanSpeed_v2(h, 0)


def test_set_dynamic_drives_what_nvml_reads(nv, workstation):
    workstation.set_dynamic(
        0,
        temp_c=83.4,
        power_draw_w=431.25,
        gpu_util_pct=99,
        memory_util_pct=40,
        sm_clock_mhz=2520,
        memory_clock_mhz=10501,
        clock_event_reasons=("sw_power_cap", "hw_thermal_slowdown"),
    )
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetTemperatureV(h, 0) == 83
    assert nv.nvmlDeviceGetPowerUsage(h) == 431250
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 99
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS) == 2520
    mask = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert mask == nv.nvmlClocksEventReasonSwPowerCap | nv.nvmlClocksEventReasonHwThermalSlowdown


def test_power_limit_within_constraints_and_refused_outside(nv, workstation):
    h = nv.nvmlDeviceGetHandleByIndex(0)  # RTX 4090: 150–450 W
    nv.nvmlDeviceSetPowerManagementLimit(h, 300000)
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 300000
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 300000
    assert workstation.power_limit_w(0) == 300.0
    for bad in (149999, 450001, 0):
        with pytest.raises(nv.NVMLError_InvalidArgument):
            nv.nvmlDeviceSetPowerManagementLimit(h, bad)
    assert workstation.power_limit_w(0) == 300.0, "a refused write changes nothing"
    with pytest.raises(TypeError):
        nv.nvmlDeviceSetPowerManagementLimit(h, 300.5)  # ctypes refuses a float, as with the real library


def test_a_driver_that_quantises_or_floors_the_limit_keeps_its_own_value(nv, workstation):
    h = nv.nvmlDeviceGetHandleByIndex(0)  # RTX 4090: 150–450 W
    workstation.quantise_power(0, step_w=25.0)
    nv.nvmlDeviceSetPowerManagementLimit(h, 229110)  # succeeds; the nearest step is kept
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 225000 == nv.nvmlDeviceGetEnforcedPowerLimit(h)
    workstation.quantise_power(0, floor_w=250.0)
    nv.nvmlDeviceSetPowerManagementLimit(h, 150000)  # the reported minimum: accepted, kept at the floor
    assert workstation.power_limit_w(0) == 250.0
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceSetPowerManagementLimit(h, 149999)  # outside the constraints: refused as before


def test_enforced_limit_follows_another_cap():
    (gh200,) = [profile(DUMPS / "gh200-nvidia-smi-q.txt")]
    fake = FakeNvml([gh200])
    nv = fake.bindings()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 900000
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700000
    nv.nvmlDeviceSetPowerManagementLimit(h, 500000)
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 500000


def test_writes_need_privilege(nv, workstation):
    workstation.privileged = False
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceSetPowerManagementLimit(h, 300000)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceSetFanSpeed_v2(h, 0, 80)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceSetDefaultFanSpeed_v2(h, 0)
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 450000


def test_fan_manual_then_back_to_automatic(nv, workstation):
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetNumFans(h) == 2
    assert nv.nvmlDeviceGetFanControlPolicy_v2(h, 1) == nv.NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW
    nv.nvmlDeviceSetFanSpeed_v2(h, 1, 80)
    assert nv.nvmlDeviceGetFanControlPolicy_v2(h, 1) == nv.NVML_FAN_POLICY_MANUAL
    assert (nv.nvmlDeviceGetFanSpeed_v2(h, 1), nv.nvmlDeviceGetTargetFanSpeed(h, 1)) == (80, 80)
    assert (workstation.fan_target_pct(0, 1), workstation.fan_auto(0, 1), workstation.fan_auto(0, 0)) == (
        80,
        False,
        True,
    )
    workstation.set_dynamic(0, fan_speed_pct=45)  # the driver's curve moves the automatic fan only
    assert (nv.nvmlDeviceGetFanSpeed_v2(h, 0), nv.nvmlDeviceGetFanSpeed_v2(h, 1)) == (45, 80)
    nv.nvmlDeviceSetDefaultFanSpeed_v2(h, 1)
    assert nv.nvmlDeviceGetFanControlPolicy_v2(h, 1) == nv.NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW
    assert nv.nvmlDeviceGetFanSpeed_v2(h, 1) == 45 and workstation.fan_auto(0, 1)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceSetFanSpeed_v2(h, 1, 101)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetFanSpeed_v2(h, 2)


def test_batched_field_values_with_per_field_return(nv, workstation):
    workstation.add_energy(1, 1.5)
    h = nv.nvmlDeviceGetHandleByIndex(1)
    ids = [
        nv.NVML_FI_DEV_POWER_INSTANT,
        nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        nv.NVML_FI_DEV_MEMORY_TEMP,
        nv.NVML_FI_DEV_POWER_REQUESTED_LIMIT,
        nv.NVML_FI_DEV_POWER_MIN_LIMIT,
        nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    ]
    v = nv.nvmlDeviceGetFieldValues(h, ids)
    assert [x.nvmlReturn for x in v] == [0, 0, 0, 0, 0, nv.NVML_ERROR_NOT_SUPPORTED]
    assert v[0].value.uiVal == 69850 and v[0].valueType == nv.NVML_VALUE_TYPE_UNSIGNED_INT
    assert v[1].value.ullVal == 1500 and v[1].valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert (v[2].value.uiVal, v[3].value.uiVal, v[4].value.uiVal) == (48, 700000, 200000)
    h0 = nv.nvmlDeviceGetHandleByIndex(0)  # the RTX 4090 has no HBM sensor
    assert (
        nv.nvmlDeviceGetFieldValues(h0, [nv.NVML_FI_DEV_MEMORY_TEMP])[0].nvmlReturn
        == nv.NVML_ERROR_NOT_SUPPORTED
    )


def test_old_drivers_lack_newer_entry_points_and_fields():
    fake = FakeNvml([profile(DUMPS / "rtx4090-nvidia-smi-q-x-driver535.xml")])  # driver 535.86.05
    nv = fake.bindings()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetTemperatureV(h, 0)
    assert nv.nvmlDeviceGetTemperature(h, 0) == 40
    old = FakeNvml([profile(DUMPS / "gtx1660ti-nvidia-smi-q-x.xml")]).bindings()  # driver 418
    old.nvmlInit()
    h = old.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: old.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda: old.nvmlDeviceGetNumFans(h),
        lambda: old.nvmlDeviceSetFanSpeed_v2(h, 0, 50),
    ):
        with pytest.raises(old.NVMLError_FunctionNotFound):
            call()
    assert old.nvmlDeviceGetCurrentClocksThrottleReasons(h) == old.nvmlClocksThrottleReasonGpuIdle
    fv = old.nvmlDeviceGetFieldValues(
        h, [old.NVML_FI_DEV_POWER_INSTANT, old.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    )
    assert [x.nvmlReturn for x in fv] == [old.NVML_ERROR_NOT_SUPPORTED, 0]


def test_injection_per_call_and_device_with_count(nv, workstation):
    workstation.inject("DeviceGetPowerUsage", 0, pynvml.NVML_ERROR_UNKNOWN, count=2)
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetPowerUsage(h1) == 69850, "the other GPU is untouched"
    for _ in range(2):
        with pytest.raises(nv.NVMLError_Unknown):
            nv.nvmlDeviceGetPowerUsage(h0)
    assert nv.nvmlDeviceGetPowerUsage(h0) == 20000, "the injection ran out"
    workstation.inject("nvmlDeviceGetTemperatureV", None, pynvml.NVML_ERROR_TIMEOUT)
    for h in (h0, h1):
        with pytest.raises(nv.NVMLError_Timeout):
            nv.nvmlDeviceGetTemperatureV(h, 0)
    workstation.clear_injections()
    assert nv.nvmlDeviceGetTemperatureV(h1, 0) == 41


def test_gpu_is_lost_fails_every_call_on_that_gpu(nv, workstation):
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    workstation.inject("nvmlDeviceGetPowerUsage", 0, pynvml.NVML_ERROR_GPU_IS_LOST)
    for call in (nv.nvmlDeviceGetName, nv.nvmlDeviceGetPowerUsage, nv.nvmlDeviceGetNumFans):
        with pytest.raises(nv.NVMLError_GpuIsLost):
            call(h0)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetPowerUsage(h1) == 69850
    workstation.remove_gpu(1)
    assert nv.nvmlDeviceGetCount() == 1
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetName(h1)


def test_no_driver_and_bad_handles():
    fake = FakeNvml([profile(A6000)], driver_loaded=False)
    nv = fake.bindings()
    with pytest.raises(nv.NVMLError_DriverNotLoaded):
        nv.nvmlInit()
    ok = FakeNvml([profile(A6000)]).bindings()
    ok.nvmlInit()
    bogus = ctypes.cast(ctypes.c_void_p(0x1234), ok.c_nvmlDevice_t)
    with pytest.raises(ok.NVMLError_InvalidArgument):
        ok.nvmlDeviceGetName(bogus)
    assert str(ok.NVMLError(ok.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"
    assert ok.nvmlErrorString(ok.NVML_ERROR_NO_PERMISSION) == "Insufficient Permissions"


def test_install_into_the_global_module_and_restore():
    saved, cache = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    fake = FakeNvml([profile(H100)])
    with fake.install(pynvml) as module:
        assert module is pynvml and pynvml.nvmlLib is fake
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H100 80GB HBM3"
        pynvml.nvmlShutdown()
    assert pynvml.nvmlLib is saved
    assert pynvml._nvmlGetFunctionPointer_cache == cache, "no fake function pointer left cached"
