"""A real GPU is never written to by discovery: `aithermd sensors` and `--dry-run` stay read-only."""

from __future__ import annotations

from aithermd.backends.nvml import NvmlBackend
from aithermd.sim.fake_nvml import FakeNvml

from .conftest import RTX4090, profile


def _refuse_every_set(bindings):
    calls: list[str] = []
    lib = bindings.nvmlLib

    class Guard:
        def __getattr__(self, name):
            fn = getattr(lib, name)
            if name.startswith("nvmlDeviceSet"):
                def refused(*args):
                    calls.append(name)
                    return fn(*args)
                refused.restype = getattr(fn, "restype", None)
                return refused
            return fn

    bindings.nvmlLib = Guard()
    bindings._nvmlGetFunctionPointer_cache.clear()
    return calls


def test_discovery_without_write_probe_calls_no_set_function():
    fake = FakeNvml([profile(RTX4090)], fan_count=2, driver_version="590.48.01")
    nv = fake.bindings()
    calls = _refuse_every_set(nv)
    backend = NvmlBackend(nvml=nv, probe_writes=False)
    try:
        devices = backend.discover()
        backend.sample()
    finally:
        backend.close()
    assert calls == []
    knob = next(k for k in devices[0].knobs if k.id == "gpu0/power_limit")
    assert (knob.min, knob.max, knob.default) == (150.0, 450.0, 450.0)


def test_without_root_and_without_probe_the_knobs_are_read_only(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    fake = FakeNvml([profile(RTX4090)], fan_count=1, driver_version="590.48.01")
    backend = NvmlBackend(nvml=fake.bindings(), probe_writes=False)
    try:
        knobs = {k.id: k for k in backend.discover()[0].knobs}
    finally:
        backend.close()
    assert knobs["gpu0/power_limit"].writable is False
    assert knobs["gpu0/power_limit"].why_not == "NVML_ERROR_NO_PERMISSION: setting the power limit needs root"
    assert knobs["gpu0/fan0"].writable is False


def test_the_fake_may_still_be_probed():
    fake = FakeNvml([profile(RTX4090)], fan_count=1, driver_version="590.48.01", privileged=False)
    backend = NvmlBackend(nvml=fake.bindings(), probe_writes=True)
    try:
        knobs = {k.id: k for k in backend.discover()[0].knobs}
    finally:
        backend.close()
    assert knobs["gpu0/power_limit"].writable is False
    assert "NO_PERMISSION" in knobs["gpu0/power_limit"].why_not
