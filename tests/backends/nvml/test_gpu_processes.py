"""Process lists through the real pynvml bindings over the fake NVML: the dumps' Processes sections, the
entry points' sizes and return codes, the struct versions, per-process utilization and the backend's read."""

from __future__ import annotations

import ctypes

import pytest

from aithermd.sim.fake_nvml import FakeNvml
from aithermd.sim.fake_nvml_procs import ProcessInfoV1
from aithermd.sim.smi_dump import load_dump
from tests.backends.nvml.conftest import DUMPS
from tests.support.clock import SimClock

T4 = DUMPS / "tesla-t4-nvidia-smi-q-x.xml"  # Xorg (G) + python (C)
A5000X2 = DUMPS / "rtx-a5000-x2-nvidia-smi-q-x.xml"  # one llama-server on both GPUs
RTX4000 = DUMPS / "rtx4000-sff-ada-nvidia-smi-q-x.xml"  # G, C and C+G processes
H100_MIG = DUMPS / "h100-mig-enabled-nvidia-smi-q-idle-and-load.txt"
H100 = DUMPS / "h100-80gb-hbm3-nvidia-smi-q-idle-and-load.txt"
MIB = 1 << 20


def test_dump_processes_text_and_xml():
    t4 = load_dump(T4)[0]
    assert [(p.pid, p.type, p.name, p.used_memory_mib) for p in t4.processes] == [
        (675, "G", "/usr/lib/xorg/Xorg", 22.0), (5762, "C", "python", 1005.0)]
    idle, load = load_dump(H100)[0].snapshots
    assert idle.processes == () and load_dump(H100)[0].processes == ()  # the profile is the first capture
    assert [(p.pid, p.name, p.used_memory_mib) for p in load.processes] == [
        (11327, "/root/tools/memhog", 2566.0), (11328, "/root/tools/memhog", 1542.0),
        (11345, "./gpu_burn", 15690.0)]
    mig = load_dump(H100_MIG)[0].snapshots[1].processes
    assert {(p.gpu_instance_id, p.compute_instance_id) for p in mig} == {(2, 0)}


def _open(fake):
    nv = fake.bindings()
    nv.nvmlInit()
    return nv, [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]


def test_fake_serves_the_dump_processes_in_the_right_lists():
    nv, (h,) = _open(FakeNvml.from_dumps([RTX4000]))
    compute = {p.pid: p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
    graphics = {p.pid for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)}
    assert compute == {4937: 160 * MIB, 34626: 183 * MIB}
    assert graphics == {1842, 3190, 34626}  # C+G is in both lists
    assert all(p.gpuInstanceId == 0xFFFFFFFF for p in nv.nvmlDeviceGetComputeRunningProcesses(h))


def test_one_process_on_two_gpus():
    nv, handles = _open(FakeNvml.from_dumps([A5000X2]))
    assert [[(p.pid, p.usedGpuMemory // MIB) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
            for h in handles] == [[(100477, 22430)], [(100477, 17246)]]


def test_size_query_and_insufficient_size_like_nvml():
    fake = FakeNvml.from_dumps([T4])
    nv, (h,) = _open(fake)
    fn = nv.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == nv.NVML_ERROR_INSUFFICIENT_SIZE and count.value == 1
    fake.stop_process(0, 5762)
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == nv.NVML_SUCCESS and count.value == 0
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_memory_info_follows_the_processes():
    fake = FakeNvml.from_dumps([T4])
    nv, (h,) = _open(fake)
    before = nv.nvmlDeviceGetMemoryInfo(h).used
    fake.start_process(0, 4242, memory_mib=2048)
    assert nv.nvmlDeviceGetMemoryInfo(h).used == before + 2048 * MIB
    fake.stop_process(0, 4242)
    fake.stop_process(0, 5762)
    assert nv.nvmlDeviceGetMemoryInfo(h).used == before - 1005 * MIB


def test_old_driver_has_v1_only_and_v1_structs_are_16_bytes():
    fake = FakeNvml.from_dumps([T4], driver_version="440.100")
    nv, (h,) = _open(fake)
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetComputeRunningProcesses_v2(h)
    # what a v2-struct reader would see from the v1 entry point: the second entry is garbage, as on a
    # real driver with mismatched bindings
    fake.start_process(0, 777, memory_mib=10)
    buf = (ProcessInfoV1 * 4)()
    count = ctypes.c_uint(4)
    assert nv.nvmlLib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(count), buf) == nv.NVML_SUCCESS
    assert [buf[i].pid for i in range(count.value)] == [5762, 777]
    wrong = (nv.c_nvmlProcessInfo_v2_t * 4)()
    count = ctypes.c_uint(4)
    nv.nvmlLib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(count), wrong)
    assert wrong[1].pid != 777


def test_process_utilization_timestamps_and_not_found():
    fake = FakeNvml.from_dumps([T4])
    nv, (h,) = _open(fake)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)  # no busy process yet
    fake.add_process_samples(0, 1_000, {5762: (50, 20, 0, 0), 675: (0, 0, 0, 0)})
    fake.add_process_samples(0, 2_000, {5762: (70, 30, 0, 0)})
    assert [(s.pid, s.timeStamp, s.smUtil) for s in nv.nvmlDeviceGetProcessUtilization(h, 0)] == [
        (5762, 1_000, 50), (5762, 2_000, 70)]  # the idle Xorg got no sample
    assert [s.timeStamp for s in nv.nvmlDeviceGetProcessUtilization(h, 1_000)] == [2_000]
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 2_000)


def test_process_utilization_not_supported_in_mig_mode():
    fake = FakeNvml.from_dumps([H100_MIG])
    nv, (h,) = _open(fake)
    fake.add_process_samples(0, 1_000, {1: (50, 0, 0, 0)})
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetProcessUtilization(h, 0)


def test_backend_usage(backend_over):
    fake, clock = FakeNvml.from_dumps([RTX4000, A5000X2]), SimClock()
    backend = backend_over(fake, clock=clock)
    start = int(clock.wall() * 1e6)  # µs: the driver stamps its samples with the CPU's wall clock
    fake.add_process_samples(0, start + 5_000, {4937: (40, 10, 0, 0), 34626: (10, 5, 0, 0)})
    fake.add_process_samples(0, start + 6_000, {4937: (60, 10, 0, 0)})
    gpu0, gpu1, gpu2 = backend.usage()
    kinds = {p.pid: (p.kinds, p.used_memory_bytes) for p in gpu0.processes}
    assert kinds == {4937: ("C", 160 * MIB), 34626: ("C+G", 183 * MIB), 1842: ("G", 410 * MIB),
                     3190: ("G", 451 * MIB)}
    assert gpu0.utilization[4937].sm_pct == 50 and gpu0.utilization[4937].busy == 100
    assert gpu0.utilization[4937].samples == 2 and set(gpu0.utilization) == {4937, 34626}
    assert gpu0.memory_total_bytes == fake.gpu(0).profile.memory_total_mib * MIB
    assert [p.pid for p in gpu1.processes] == [p.pid for p in gpu2.processes] == [100477]
    # the next read sees only newer samples; none → "no busy process", not an error
    assert backend.usage()[0].utilization == {}
    fake.add_process_samples(0, start + 7_000, {34626: (30, 0, 0, 0)})
    assert set(backend.usage()[0].utilization) == {34626}


def _down_then_up(fake, clock, stamp_us):
    """GPU 0's driver buffer after a daemon restart: pid 7001 kept it busy for 100 s and exited while the
    daemon was down (30 s before the start); → (backend started now, then 10 s of pid 7002 at 100 %)."""
    fake.start_process(0, 7001, memory_mib=8000)
    for s in range(100):
        fake.add_process_samples(0, stamp_us(clock.wall() - 130 + s), {7001: (100, 60, 0, 0)})
    fake.stop_process(0, 7001)
    fake.start_process(0, 7002, memory_mib=8000)


def test_the_first_read_after_a_start_counts_no_sample_of_the_buffer_from_before_it(backend_over):
    """attack9 N5: from ``lastSeen`` 0 the first read returned the driver's whole buffer, and the dead pid
    7001 shared the first pass's energy with pid 7002, which alone used the GPU since the start."""
    fake, clock = FakeNvml.from_dumps([T4]), SimClock()
    _down_then_up(fake, clock, lambda t: int(t * 1e6))
    backend = backend_over(fake, clock=clock)
    for _ in range(10):
        clock.advance(1.0)
        fake.add_process_samples(0, int(clock.wall() * 1e6), {7002: (100, 60, 0, 0)})
    (gpu,) = backend.usage()
    assert set(gpu.utilization) == {7002} and gpu.utilization[7002].samples == 10
    clock.advance(1.0)
    fake.add_process_samples(0, int(clock.wall() * 1e6), {7002: (50, 60, 0, 0)})
    (gpu,) = backend.usage()  # and on from the newest: nothing twice
    assert gpu.utilization[7002].samples == 1 and gpu.utilization[7002].sm_pct == 50


def test_a_driver_on_a_clock_ahead_of_the_wall_clock_loses_no_sample(backend_over):
    """Timestamps the wall clock cannot have made (ns, say): the buffer is counted whole, as before."""
    fake, clock = FakeNvml.from_dumps([T4]), SimClock()
    _down_then_up(fake, clock, lambda t: int(t * 1e9))
    backend = backend_over(fake, clock=clock)
    clock.advance(1.0)
    fake.add_process_samples(0, int(clock.wall() * 1e9), {7002: (100, 60, 0, 0)})
    (gpu,) = backend.usage()
    # the ring holds 100 samples: the oldest of 7001's went out for 7002's
    assert gpu.utilization[7001].samples == 99 and gpu.utilization[7002].samples == 1


def test_backend_usage_falls_back_to_v2_and_reports_mig_and_lost(backend_over):
    fake = FakeNvml.from_dumps([T4, H100_MIG], driver_version="470.82.01")
    backend = backend_over(fake)
    fake.start_process(1, 21198, memory_mib=7484, gpu_instance_id=2, compute_instance_id=0)
    t4, mig = backend.usage()
    assert [p.pid for p in t4.processes] == [5762, 675]  # through the _v2 entry points
    assert mig.processes[0].gpu_instance_id == 2 and mig.utilization is None
    assert mig.utilization_error == "NVML_ERROR_NOT_SUPPORTED"
    fake.lose_gpu(0)
    lost, _ = backend.usage()
    assert lost.processes is None and lost.error == "NVML_ERROR_GPU_IS_LOST"


def test_backend_usage_on_a_driver_without_v2_lists(backend_over):
    backend = backend_over(FakeNvml.from_dumps([T4], driver_version="440.100"))
    (t4,) = backend.usage()
    assert t4.processes is None and "R450" in t4.error
