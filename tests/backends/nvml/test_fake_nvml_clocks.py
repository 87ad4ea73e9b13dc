"""The fake NVML's locked clocks, supported clocks and GPM, through the real pynvml bindings: MHz, the
real constraints and return codes."""

from __future__ import annotations

import itertools

import pytest

from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import DUMPS, H100, RTX4090, profile

P100 = DUMPS / "tesla-p100-nvidia-smi-q-x.xml"  # Pascal: no locked clocks


@pytest.fixture
def nv(workstation):
    module = workstation.bindings()
    module.nvmlInit()
    yield module
    module.nvmlShutdown()


def test_locked_clocks_are_set_clamped_and_reset(nv, workstation):
    h = nv.nvmlDeviceGetHandleByIndex(0)  # RTX 4090: 210–3105 MHz
    assert workstation.locked_clock_max_mhz(0) is None
    nv.nvmlDeviceSetGpuLockedClocks(h, 210, 1500)
    assert workstation.locked_clock_max_mhz(0) == 1500
    nv.nvmlDeviceSetGpuLockedClocks(h, 0, 9000)  # beyond the supported range: held to it, not refused
    assert workstation.locked_clock_max_mhz(0) == 3105
    nv.nvmlDeviceSetGpuLockedClocks(h, 210, nv.NVML_CLOCK_LIMIT_ID_UNLIMITED)
    assert workstation.locked_clock_max_mhz(0) == 3105
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceSetGpuLockedClocks(h, 1500, 1000)
    nv.nvmlDeviceResetGpuLockedClocks(h)
    assert workstation.locked_clock_max_mhz(0) is None


def test_locked_clocks_need_root_and_volta(workstation):
    workstation.privileged = False
    nv = workstation.bindings()
    nv.nvmlInit()
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceSetGpuLockedClocks(nv.nvmlDeviceGetHandleByIndex(0), 210, 1500)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceResetGpuLockedClocks(nv.nvmlDeviceGetHandleByIndex(0))
    pascal = FakeNvml([profile(P100)]).bindings()
    pascal.nvmlInit()
    with pytest.raises(pascal.NVMLError_NotSupported):
        pascal.nvmlDeviceSetGpuLockedClocks(pascal.nvmlDeviceGetHandleByIndex(0), 500, 1000)


def test_a_lock_survives_into_another_process(tmp_path):
    path = tmp_path / "nvml.json"
    fake = FakeNvml([profile(RTX4090)], state_path=path)
    nv = fake.bindings()
    nv.nvmlInit()
    nv.nvmlDeviceSetGpuLockedClocks(nv.nvmlDeviceGetHandleByIndex(0), 210, 900)
    assert FakeNvml.open(path).locked_clock_max_mhz(0) == 900


def test_supported_graphics_clocks(nv):
    h = nv.nvmlDeviceGetHandleByIndex(0)
    clocks = nv.nvmlDeviceGetSupportedGraphicsClocks(h, 10501)
    assert clocks[0] == 3105 and clocks[-1] >= 210 and clocks == sorted(clocks, reverse=True)
    assert all(a - b == 15 for a, b in itertools.pairwise(clocks))
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSupportedGraphicsClocks(h, 1234)


def test_gpm_rates_over_an_interval_on_hopper_only(nv, workstation):
    h100, ada = nv.nvmlDeviceGetHandleByIndex(1), nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlGpmQueryDeviceSupport(h100).isSupportedDevice == 1
    assert nv.nvmlGpmQueryDeviceSupport(ada).isSupportedDevice == 0
    first, second = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h100, first)
    workstation.set_dynamic(1, gpu_util_pct=100, gpm_tensor_pct=40.0)
    workstation.add_energy(1, 600.0, dt_s=1.0)
    workstation.set_dynamic(1, gpm_tensor_pct=60.0)
    workstation.add_energy(1, 600.0, dt_s=1.0)
    nv.nvmlGpmSampleGet(h100, second)
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, 2, first, second
    mg.metrics[0].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    mg.metrics[1].metricId = nv.NVML_GPM_METRIC_FP64_UTIL
    nv.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == nv.NVML_SUCCESS and mg.metrics[0].value == pytest.approx(50.0)
    assert mg.metrics[1].nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlGpmSampleGet(ada, first)
    mg.version = 2
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlGpmMetricsGet(mg)
    nv.nvmlGpmSampleFree(first)
    nv.nvmlGpmSampleFree(second)


def test_gpm_is_absent_before_driver_520():
    old = FakeNvml([profile(H100)], driver_version="515.65.01").bindings()
    old.nvmlInit()
    with pytest.raises(old.NVMLError_FunctionNotFound):
        old.nvmlGpmQueryDeviceSupport(old.nvmlDeviceGetHandleByIndex(0))
