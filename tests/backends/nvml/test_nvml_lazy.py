"""The daemon's NVML bindings on a machine without the NVIDIA library (issue 22, start-up): pynvml is not
imported until the library can load, and the backend behaves as over pynvml itself: zero GPUs, the same
``NVML_ERROR_LIBRARY_NOT_FOUND``, the same retry with backoff that adopts the GPUs of a driver installed
later, with every error name of the real bindings from then on."""

from __future__ import annotations

import inspect
import sys

import pynvml
import pytest
from structlog.testing import capture_logs

from aithermd.backends import nvml_lazy
from aithermd.backends.nvml import NvmlBackend
from aithermd.backends.nvml_lazy import LazyNvml
from aithermd.backends.registry import open_for_daemon
from aithermd.settings import DaemonSettings
from aithermd.sim.fake_nvml import FakeNvml
from tests.backends.nvml.conftest import H100, RTX4090, profile


def test_the_stand_in_is_what_pynvml_does_without_its_library():
    assert nvml_lazy.LIBRARY_NOT_FOUND == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert f'CDLL("{nvml_lazy.LIBRARY}")' in inspect.getsource(pynvml._LoadNvmlLibrary)


def _no_library_backend(nvml, clock):
    backend = NvmlBackend(nvml=nvml, clock=clock)
    with capture_logs() as logs:
        devices = backend.discover()
    sample = backend.sample()
    backend.close()
    failed = [{k: v for k, v in e.items() if k != "timestamp"}
              for e in logs if e["event"] == "nvml_init_failed"]
    return devices, backend.unavailable, sample.readings, sample.health.get("nvml"), failed


def test_without_the_library_nothing_is_imported_and_the_backend_says_what_pynvml_would(clock, monkeypatch):
    real = FakeNvml().bindings()  # a private copy of the real bindings with no library loaded
    real.nvmlLib = None
    monkeypatch.setattr(real, "CDLL", lambda name: (_ for _ in ()).throw(OSError(f"{name}: cannot open")))
    expected = _no_library_backend(real, clock)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import of pynvml raises ImportError
    lazy = LazyNvml(loads=lambda: False)
    got = _no_library_backend(lazy, clock)
    assert not lazy.loaded
    assert got == expected
    assert got[1] == "NVML_ERROR_LIBRARY_NOT_FOUND" and got[4][0]["retry_in_s"] == 1.0


def test_a_library_installed_later_brings_pynvml_and_its_gpus(clock, monkeypatch):
    fake = FakeNvml([profile(RTX4090), profile(H100)], fan_count=[2, None])
    monkeypatch.setitem(sys.modules, "pynvml", fake.bindings())  # what `import pynvml` gives from now on
    there = [False]
    lazy = LazyNvml(loads=lambda: there[0])
    backend = NvmlBackend(nvml=lazy, clock=clock)
    try:
        assert backend.discover() == [] and not lazy.loaded
        there[0] = True
        clock.advance(5.0)  # past the first backoff
        backend.sample()
        assert backend.take_changes() and lazy.loaded
        assert [d.id for d in backend.discover()] == ["gpu0", "gpu1"]
        assert backend.life.names[pynvml.NVML_ERROR_GPU_IS_LOST] == "NVML_ERROR_GPU_IS_LOST"  # names complete
        assert lazy.NVMLError is sys.modules["pynvml"].NVMLError  # the stand-ins are gone
    finally:
        backend.close()


@pytest.mark.parametrize("imported", [True, False])
def test_the_daemon_takes_pynvml_when_imported_else_the_lazy_bindings(tmp_path, monkeypatch, imported):
    if not imported:
        monkeypatch.delitem(sys.modules, "pynvml")
    settings = DaemonSettings(sysfs_root=tmp_path, state_dir=tmp_path / "state", bus="none",
                              metrics_listen="none")
    backends = open_for_daemon(settings)
    try:
        (gpus,) = [b for b in backends if isinstance(b, NvmlBackend)]
        assert (gpus.nvml is pynvml) if imported else isinstance(gpus.nvml, LazyNvml)
    finally:
        for b in backends:
            b.close()
