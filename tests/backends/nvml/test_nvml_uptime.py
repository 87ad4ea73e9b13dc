"""NVML over months, through the real pynvml bindings over the fake NVML: initialised again after Unknown
Error, a version mismatch or an unloaded driver; GPUs not ready at start adopted; a lost GPU checked with
backoff; a hung GPU isolated; capabilities instead of crashes; pre-Volta energy estimated; release."""

from __future__ import annotations


import pynvml as E
import pytest
import structlog

from aithermd.backends.nvml import NvmlBackend
from aithermd.clock import FakeClock
from aithermd.errors import BackendTimeout, NoPermission
from aithermd.model import Status
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import DUMPS, profile, released, two


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make(clock):
    made: list[NvmlBackend] = []

    def build(fake: FakeNvml, **kw) -> NvmlBackend:
        backend = NvmlBackend(nvml=fake.bindings(), clock=clock, **kw)
        made.append(backend)
        return backend

    yield build
    for b in made:
        b.close()


def ok(sample, channel: str) -> float | None:
    r = sample.readings[channel]
    return r.value if r.status is Status.OK else None


def test_unknown_error_is_cured_by_initialising_nvml_again_with_backoff(make, clock):
    fake = two()
    backend = make(fake)
    backend.discover()
    fake.fail_library(E.NVML_ERROR_UNKNOWN)  # e.g. a cgroup reload under a container: the session breaks
    s = backend.sample()
    assert s.lost == {"gpu0", "gpu1"}
    assert s.readings["gpu0/temperature"].detail.startswith("NVML_ERROR_UNKNOWN")
    inits = []
    for _ in range(6):  # still failing: nvmlInit is tried again at 0, 1, 2, 4 ... s, not every tick
        clock.advance(1.0)
        before = fake.calls.get("nvmlInitWithFlags", 0) + fake.calls.get("nvmlInit_v2", 0)
        backend.sample()
        inits.append(fake.calls.get("nvmlInitWithFlags", 0) + fake.calls.get("nvmlInit_v2", 0) - before)
    assert sum(inits) < 6 and inits[0] == 1
    fake.fail_library(None)  # the cause is gone, but the open session stays broken until nvmlInit again
    clock.advance(60.0)
    s = backend.sample()
    assert s.lost == frozenset() and ok(s, "gpu0/temperature") is not None and ok(s, "gpu1/power") == 69.85
    assert s.health["nvml"]["reinits"] >= 1 and s.health["nvml"]["library"] == "up"
    assert [d.id for d in backend.discover()] == ["gpu0", "gpu1"]


def test_a_version_mismatch_names_the_fix_and_recovers(make, clock):
    fake = two()
    backend = make(fake)
    backend.discover()
    fake.fail_library(E.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            backend.sample()
            clock.advance(2.0)
    failed = [e for e in logs if e["event"] == "nvml_init_failed"]
    assert len(failed) == 1 and "reboot" in failed[0]["hint"]  # logged once, with what to do
    fake.fail_library(None)
    clock.advance(600.0)
    assert backend.sample().lost == frozenset()


def test_a_driver_loaded_after_the_daemon_started_brings_its_gpus(make, clock):
    fake = two()
    fake.fail_library(E.NVML_ERROR_DRIVER_NOT_LOADED)
    backend = make(fake)
    assert backend.discover() == [] and backend.unavailable == "NVML_ERROR_DRIVER_NOT_LOADED"
    assert backend.sample().readings == {} and not backend.take_changes()
    fake.fail_library(None)
    clock.advance(5.0)
    backend.sample()
    assert backend.take_changes(), "the runtime is told to rediscover"
    assert [d.id for d in backend.discover()] == ["gpu0", "gpu1"]
    assert ok(backend.sample(), "gpu1/power") == 69.85


def test_a_gpu_not_ready_at_start_is_adopted_when_it_answers(make, clock):
    fake = two()
    fake.inject("nvmlDeviceGetHandleByIndex_v2", 0, E.NVML_ERROR_NOT_READY)
    backend = make(fake)
    assert [d.id for d in backend.discover()] == ["gpu1"], "the GPU that answers keeps its index"
    health = backend.sample().health["nvml"]
    assert (health["expected"], health["present"]) == (2, 1)
    fake.clear_injections()
    for _ in range(4):
        clock.advance(8.0)
        backend.sample()
    assert backend.take_changes()
    devices = backend.discover()
    assert [d.id for d in devices] == ["gpu0", "gpu1"]
    assert devices[0].info["uuid"] == fake.gpus[0].uuid
    health = backend.sample().health["nvml"]
    assert (health["expected"], health["present"]) == (2, 2)


def test_a_lost_gpu_is_checked_with_backoff_and_comes_back_after_a_reset(make, clock):
    fake = two()
    backend = make(fake)
    backend.discover()
    fake.lose_gpu(1)
    with structlog.testing.capture_logs() as logs:
        s = backend.sample()
    assert s.lost == {"gpu1"} and ok(s, "gpu0/temperature") is not None
    (lost,) = [e for e in logs if e["event"] == "gpu_lost"]
    assert lost["pci_bus_id"] == fake.gpus[1].bus_id and lost["gpu"] == "gpu1"  # named by PCI bus id
    before = dict(fake.calls)
    checks = 0
    for _ in range(60):  # a minute of 1 s ticks: the lost GPU is looked at a handful of times, not 60
        clock.advance(1.0)
        n = fake.calls.get("nvmlDeviceGetHandleByPciBusId_v2", 0)
        backend.sample()
        checks += fake.calls.get("nvmlDeviceGetHandleByPciBusId_v2", 0) > n
    assert 3 <= checks <= 6, checks
    reads = fake.calls.get("nvmlDeviceGetFieldValues", 0) - before.get("nvmlDeviceGetFieldValues", 0)
    assert reads <= 60 + checks  # gpu0 every tick, gpu1 only when checked
    fake.revive_gpu(1)  # reset: new handles, the old one still answers GPU_IS_LOST
    clock.advance(300.0)
    s = backend.sample()
    assert s.lost == frozenset() and ok(s, "gpu1/power") == 69.85
    assert s.health["nvml"]["gpus"]["gpu1"]["state"] == "ok"


def test_a_hung_gpu_delays_and_blanks_no_other(make, clock):
    fake = two()
    backend = make(fake, read_deadline_s=0.2)
    backend.discover()
    fake.hang(0)
    try:
        s = backend.sample()
        stuck = s.readings["gpu0/temperature"]
        assert stuck.status is Status.STALE and "hung" in stuck.detail
        assert ok(s, "gpu1/temperature") == 41.0 and "gpu0" in s.lost and "gpu1" not in s.lost
        assert s.health["nvml"]["gpus"]["gpu0"]["state"] == "hung"
        s = backend.sample()  # the hung GPU is not asked again while its call is stuck
        assert ok(s, "gpu1/power") == 69.85
        backend.write_knob("gpu1/power_limit", 500.0)  # the other GPU is still written
        assert fake.power_limit_w(1) == 500.0
        with pytest.raises(BackendTimeout, match="hung"):
            backend.write_knob("gpu0/power_limit", 300.0)  # refused at once
    finally:
        fake.unhang()
    assert released(backend, "gpu0", 2.5), "the stuck call returned"
    s = backend.sample()
    assert s.lost == frozenset() and ok(s, "gpu0/temperature") is not None


def test_not_supported_informational_queries_never_drop_a_gpu(make):
    fake = two()
    for fn in ("nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetTemperatureThreshold"):
        fake.inject(fn, 1, E.NVML_ERROR_NOT_SUPPORTED)
    backend = make(fake)
    devices = backend.discover()
    assert [d.id for d in devices] == ["gpu0", "gpu1"]
    assert devices[1].name == "NVIDIA GPU" and devices[1].info["pci_bus_id"] == ""
    temp = next(c for c in devices[1].channels if c.attribute == "temperature")
    assert dict(temp.thresholds) == {}
    assert ok(backend.sample(), "gpu1/temperature") == 41.0


def test_no_data_repeated_becomes_unsupported_and_is_asked_again_hourly(make, clock):
    fake = two()
    backend = make(fake)
    backend.discover()
    fake.inject("nvmlDeviceGetUtilizationRates", 1, E.NVML_ERROR_NO_DATA)
    statuses = []
    for _ in range(3):
        statuses.append(backend.sample().readings["gpu1/utilization"].status)
        clock.advance(1.0)
    assert statuses == [Status.FAILED, Status.FAILED, Status.NOT_SUPPORTED]
    n = fake.calls["nvmlDeviceGetUtilizationRates"]
    for _ in range(10):
        s = backend.sample()
        clock.advance(1.0)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] - n == 10, "asked of gpu0 only, not of gpu1 every tick"
    assert s.readings["gpu1/utilization"].status is Status.NOT_SUPPORTED and "gpu1" not in s.lost
    fake.clear_injections()
    clock.advance(3600.0)
    assert ok(backend.sample(), "gpu1/utilization") is not None


def test_no_permission_on_a_write_as_root_makes_the_knob_read_only_once(make):
    fake = two()
    backend = make(fake, probe_writes=False)
    (gpu0, _) = backend.discover()
    fake.privileged = False  # a container without CAP_SYS_ADMIN: NVML answers NO_PERMISSION even to root
    with pytest.raises(NoPermission):
        backend.write_knob("gpu0/power_limit", 300.0)
    assert backend.take_changes()
    knob = next(k for k in backend.discover()[0].knobs if k.id == "gpu0/power_limit")
    assert not knob.writable and "NO_PERMISSION" in knob.why_not and "CAP_SYS_ADMIN" in knob.why_not
    n = fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0)
    with structlog.testing.capture_logs() as logs, pytest.raises(NoPermission):
        backend.write_knob("gpu0/power_limit", 300.0)  # asked anyway (the applier: a safety decision)
    assert fake.calls.get("nvmlDeviceSetPowerManagementLimit", 0) == n + 1, "tried: it may take it now"
    assert not backend.take_changes() and not logs, "said once: still read-only"
    fake.privileged = True
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 300.0)
    assert fake.power_limit_w(0) == 300.0 and [e["event"] for e in logs] == ["knob_writable_again"]
    assert backend.take_changes()
    assert next(k for k in backend.discover()[0].knobs if k.id == "gpu0/power_limit").writable


def test_no_permission_after_writes_that_went_through_is_refused_for_now_not_read_only(make, clock):
    """attack4 B5: one NO_PERMISSION (across a safety cut) made the limit read-only for the daemon's life;
    a knob that took writes before stays writable, each write asked is made, and said once."""
    fake = two()
    backend = make(fake, probe_writes=False)
    backend.discover()
    backend.write_knob("gpu0/power_limit", 400.0)  # taken
    fake.inject("nvmlDeviceSetPowerManagementLimit", 0, E.NVML_ERROR_NO_PERMISSION)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            with pytest.raises(NoPermission):
                backend.write_knob("gpu0/power_limit", 200.0)
            clock.advance(1.0)
    assert fake.calls["nvmlDeviceSetPowerManagementLimit"] == 4, "every write asked is made"
    assert [e["event"] for e in logs] == ["knob_write_refused"], "said once"
    assert not backend.take_changes(), "not read-only: nothing to rediscover"
    assert next(k for k in backend.discover()[0].knobs if k.id == "gpu0/power_limit").writable
    fake.clear_injections()
    with structlog.testing.capture_logs() as logs:
        backend.write_knob("gpu0/power_limit", 200.0)
    assert fake.power_limit_w(0) == 200.0 and [e["event"] for e in logs] == ["knob_write_back"]


def test_pre_volta_energy_is_integrated_from_power_and_marked_estimated(make, clock):
    fake = FakeNvml([profile(DUMPS / "tesla-p100-nvidia-smi-q-x.xml")])
    backend = make(fake)
    (gpu,) = backend.discover()
    energy = next(c for c in gpu.channels if c.attribute == "energy")
    assert energy.estimated
    fake.set_dynamic(0, power_draw_w=100.0)
    first = backend.sample().readings["gpu0/energy"].value
    clock.advance(10.0)
    second = backend.sample().readings["gpu0/energy"].value
    assert (first, second) == (0.0, pytest.approx(1000.0))
    v100 = make(FakeNvml([profile(DUMPS / "v100-sxm2-x8-nvidia-smi-q.txt")]))
    (gpu,) = v100.discover()
    assert not next(c for c in gpu.channels if c.attribute == "energy").estimated


def test_a_released_gpu_is_no_longer_used_or_adopted(make, clock):
    fake = two()
    backend = make(fake)
    backend.discover()
    backend.release("gpu0")
    assert [d.id for d in backend.discover()] == ["gpu1"] and backend.take_changes() is False
    n = fake.calls.get("nvmlDeviceGetFieldValues", 0)
    clock.advance(120.0)
    s = backend.sample()
    assert "gpu0/temperature" not in s.readings and ok(s, "gpu1/temperature") == 41.0
    assert fake.calls["nvmlDeviceGetFieldValues"] == n + 1, "only the kept GPU is read"
    backend.unrelease(fake.gpus[0].bus_id)  # a udev add for its PCI device: adopted again
    clock.advance(1.0)
    backend.sample()
    assert [d.id for d in backend.discover()] == ["gpu0", "gpu1"]


@pytest.mark.parametrize("code", [E.NVML_ERROR_UNKNOWN, E.NVML_ERROR_GPU_IS_LOST])
def test_a_restore_at_the_stop_asks_a_down_gpu_again_without_waiting_for_its_backoff(make, clock, code):
    """Found by killing a simulated daemon 2 s after gpu0:UNKNOWN@100s-130s ended: the GPU answered again,
    but its next check was 30 s away, so the stop left its power limit unrestored (exit 1)."""
    fake = two()
    backend = make(fake)
    backend.discover()
    original = backend.save_knob("gpu0/power_limit")
    backend.write_knob("gpu0/power_limit", 300.0)
    fake.inject("*", 0, code)
    for _ in range(40):  # the GPU stays down for a while: its checks back off to many seconds apart
        clock.advance(1.0)
        backend.sample()
    fake.clear_injections("*", 0)  # it answers again; the daemon is stopped before its next check
    if code == E.NVML_ERROR_GPU_IS_LOST:
        fake.revive_gpu(0)  # back from a reset: new handles, the driver's default limit
        fake.gpus[0].limit_mw = 300_000  # (a reset that kept the daemon's limit, to see it restored)
    clock.advance(1.0)
    backend.restore_knob("gpu0/power_limit", original)
    assert fake.power_limit_w(0) == original["limit_mw"] / 1000


def test_a_down_gpu_is_back_at_the_first_tick_it_answers_not_at_its_next_backoff_check(make, clock):
    """gpu0 answered Unknown Error for 40 s, then answered again: it stayed down until its backoff check
    (2, 4, 8, 16, 32 s apart: up to 30 s more), while gpu1 was read every tick."""
    fake = two()
    backend = make(fake)
    backend.discover()
    fake.inject("*", 0, E.NVML_ERROR_UNKNOWN)  # every call on gpu0
    assert backend.sample().lost == {"gpu0"}
    for _ in range(40):
        clock.advance(1.0)
        s = backend.sample()
        assert s.lost == {"gpu0"} and ok(s, "gpu1/power") == 69.85
    inits = fake.calls.get("nvmlInitWithFlags", 0) + fake.calls.get("nvmlInit_v2", 0)
    fake.clear_injections("*", 0)
    clock.advance(1.0)
    with structlog.testing.capture_logs() as logs:
        s = backend.sample()
    assert s.lost == frozenset() and ok(s, "gpu0/temperature") is not None
    assert s.health["nvml"]["gpus"]["gpu0"]["state"] == "ok"
    (back,) = [e for e in logs if e["event"] == "gpu_back"]
    assert back["gpu"] == "gpu0" and back["after_s"] == 41.0
    # it answered the library as it was: no nvmlInit again (that would take every GPU's handles away)
    assert fake.calls.get("nvmlInitWithFlags", 0) + fake.calls.get("nvmlInit_v2", 0) == inits
