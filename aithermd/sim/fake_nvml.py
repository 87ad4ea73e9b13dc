"""A fake NVML library that stands beneath the real ``pynvml`` bindings (nvidia-ml-py).

``pynvml`` finds every C function with ``getattr(pynvml.nvmlLib, "nvmlX")`` (``_nvmlGetFunctionPointer``,
cached in ``_nvmlGetFunctionPointer_cache``) and calls it with ctypes arguments. A :class:`FakeNvml` set as
``nvmlLib`` answers those lookups, so the bindings' own argument handling, structures and error classes
run unchanged. Two ways in::

    nvml = fake.bindings()              # a private copy of the pynvml module, nothing global touched
    with fake.install(pynvml): ...      # patch a module (the global one), restored on exit

GPUs come from :class:`~aithermd.sim.gpu_profile.GpuProfile` (``nvidia-smi -q`` dumps). NVML semantics kept:
units (mW, mJ, °C, %), ``NVML_ERROR_UNINITIALIZED`` before ``nvmlInit``, limits outside the constraints
fail with ``INVALID_ARGUMENT``, writes without privilege with ``NO_PERMISSION``, missing capabilities with
``NOT_SUPPORTED``, a lost GPU with ``GPU_IS_LOST`` on every call, functions newer than the fake's driver
branch are absent (``FUNCTION_NOT_FOUND``), the energy counter is absent before Volta. Faults can be
injected: an error per function and device (:meth:`FakeNvml.inject`), the whole library failing with one
code, ``nvmlInit`` included (:meth:`FakeNvml.fail_library`: the driver unloaded, a version mismatch after an
upgrade, Unknown Error), calls on one GPU that hang until released (:meth:`FakeNvml.hang`; other GPUs answer
meanwhile), an out-of-band power cap below the management limit (:meth:`FakeNvml.cap_power`).
Process lists and per-process utilization: :mod:`aithermd.sim.fake_nvml_procs` (GPUs start with
their dump's processes).

Indexes taken by the simulator helpers (``set_dynamic(index, ...)``) are positions in the profile list,
stable even after :meth:`remove_gpu`; NVML indexes count only the GPUs still present.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from aithermd.sim.fake_nvml_clocks import NvmlClockFunctions
from aithermd.sim.fake_nvml_lib import (
    FUNCTION_SINCE,
    GPU_IS_LOST,
    HANDLE_BASE,
    HANDLE_EPOCH,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    UNINITIALIZED,
    NvmlFunctions,
    NvmlReturn,
)
from aithermd.sim.fake_nvml_procs import NvmlProcessFunctions
from aithermd.sim.fake_nvml_readings import NvmlReadingFunctions
from aithermd.sim.fake_nvml_sim import SimulatorControls
from aithermd.sim.fake_nvml_state import (
    DEFAULT_DRIVER,
    FakeGpu,
    StateFile,
    dump_state,
    load_gpus,
    unique_bus_ids,
)
from aithermd.sim.gpu_profile import GpuProfile
from aithermd.sim.profiles import load_profiles


class _CFunction:
    """What ``getattr(nvmlLib, name)`` returns: callable like a ctypes function pointer, with ``restype``."""

    __slots__ = ("name", "restype", "argtypes", "_lib", "_impl")

    def __init__(self, lib: FakeNvml, name: str, impl: Any) -> None:
        self.name, self._lib, self._impl, self.restype, self.argtypes = name, lib, impl, None, None

    def __call__(self, *args: Any) -> Any:
        lib = self._lib
        if lib._hangs and args:  # a hung GPU blocks its own callers only, outside the library's lock
            gate = lib._hangs.get(_position(args[0]))
            if gate is not None:
                gate.wait()
        with lib._lock:
            lib.calls[self.name] = lib.calls.get(self.name, 0) + 1
            if self.name not in _LIFECYCLE:
                if lib.library_error is not None:
                    return lib.library_error
                if lib._broken is not None:  # broken under this session: only a new nvmlInit cures it
                    return lib._broken
            elif lib.library_error is not None and self.name.startswith("nvmlInit"):
                return lib.library_error
            try:
                lib._sync()
                return self._impl(*args)
            except NvmlReturn as exc:
                return exc.code


class FakeNvml(NvmlFunctions, NvmlReadingFunctions, NvmlProcessFunctions, NvmlClockFunctions,
               SimulatorControls):
    """A set of fake GPUs behind NVML's C API.

    ``profiles``: the GPUs, in NVML index order. ``state_path``: JSON file written now and on every change
    of control state, for :meth:`open` in another process. ``privileged``: whether writes are allowed (root);
    False makes every Set* call fail with ``NVML_ERROR_NO_PERMISSION``. ``driver_version``: defaults to the
    first profile's (entry points newer than its branch are absent). ``missing_functions``: more C names to
    leave out. ``fan_count``: fans per GPU, one number for all or one per GPU (None: as many as the dump
    showed, 0 or 1).
    ``driver_loaded`` False makes ``nvmlInit`` fail with ``NVML_ERROR_DRIVER_NOT_LOADED``.
    """

    def __init__(
        self,
        profiles: Sequence[GpuProfile] = (),
        *,
        state_path: str | Path | None = None,
        privileged: bool = True,
        driver_version: str | None = None,
        missing_functions: Iterable[str] = (),
        fan_count: int | Sequence[int | None] | None = None,
        driver_loaded: bool = True,
        _gpus: list[FakeGpu] | None = None,
    ) -> None:
        profiles = list(profiles)
        if _gpus is None:
            counts = list(fan_count) if isinstance(fan_count, Sequence) else [fan_count] * len(profiles)
            _gpus = [
                FakeGpu.from_profile(p, bus, n)
                for p, bus, n in zip(profiles, unique_bus_ids(profiles), counts, strict=True)
            ]
        self.gpus: list[FakeGpu] = _gpus
        first = next((g.profile.driver_version for g in self.gpus if g.profile.driver_version), None)
        self.driver_version: str = driver_version or first or DEFAULT_DRIVER
        self.driver_branch: int = int(self.driver_version.split(".")[0])
        self.driver_loaded = driver_loaded
        self._privileged = privileged
        self._missing = {n for n, since in FUNCTION_SINCE.items() if self.driver_branch < since}
        self._missing |= {_c_name(n) for n in missing_functions}
        self._refcount = 0
        self._lock = threading.RLock()
        self._functions: dict[str, _CFunction] = {}
        self._injections: dict[tuple[str, int | None], list[Any]] = {}
        self._hangs: dict[int, threading.Event] = {}
        self.library_error: int | None = None  # every call answers this code (fail_library)
        self._broken: int | None = None  # the failure that broke the open session (until re-initialised)
        self.calls: dict[str, int] = {}  # C function → calls made (tests count what a lost GPU costs)
        self._file = StateFile(state_path) if state_path is not None else None
        if self._file is not None and _gpus is not None and profiles:
            self._persist()

    # ---- construction ----
    @classmethod
    def from_dumps(cls, paths: Iterable[str | Path], **kw: Any) -> FakeNvml:
        """GPUs from ``nvidia-smi -q`` dumps (text or XML) or profile JSON files, in order."""
        return cls(load_profiles(paths), **kw)

    @classmethod
    def open(cls, state_path: str | Path) -> FakeNvml:
        """The same GPUs another process created with ``state_path`` (limits, fan modes, lost GPUs included).
        Raises OSError or ValueError when the file is missing or not a fake NVML state file."""
        data = StateFile(state_path).read()
        return cls(
            state_path=state_path,
            privileged=data["privileged"],
            driver_version=data["driver_version"],
            missing_functions=data.get("missing_functions", ()),
            _gpus=load_gpus(data),
        )

    @property
    def state_path(self) -> Path | None:
        return None if self._file is None else self._file.path

    # ---- the library object pynvml sees ----
    def __getattr__(self, name: str) -> _CFunction:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        functions = self.__dict__.get("_functions")
        if functions is None or name in self._missing:
            raise AttributeError(name)
        fn = functions.get(name)
        if fn is None:
            impl = getattr(type(self), "_" + name, None)
            if impl is None:
                raise AttributeError(name)
            fn = functions[name] = _CFunction(self, name, impl.__get__(self))
        return fn

    def bindings(self) -> ModuleType:
        """A private copy of the ``pynvml`` module with this fake as its library (nothing global patched)."""
        spec = importlib.util.find_spec("pynvml")
        assert spec is not None and spec.origin is not None
        name = f"pynvml_fake_{id(self):x}"
        private = importlib.util.spec_from_file_location(name, spec.origin)
        assert private is not None and private.loader is not None
        module = importlib.util.module_from_spec(private)
        sys.modules[name] = module  # pynvml looks itself up there while importing
        try:
            private.loader.exec_module(module)
        finally:
            del sys.modules[name]
        module.nvmlLib = self
        return module

    @contextmanager
    def install(self, module: ModuleType) -> Iterator[ModuleType]:
        """Make this fake ``module.nvmlLib`` (clearing the function-pointer cache); put the real one back."""
        cache = module._nvmlGetFunctionPointer_cache
        saved = (module.nvmlLib, dict(cache), module._nvmlLib_refcount)
        module.nvmlLib = self
        cache.clear()
        try:
            yield module
        finally:
            module.nvmlLib = saved[0]
            cache.clear()
            cache.update(saved[1])
            module._nvmlLib_refcount = saved[2]

    # ---- hooks used by the C functions ----
    def _present(self) -> list[FakeGpu]:
        return [g for g in self.gpus if not g.removed]

    def _ensure_init(self) -> None:
        if self._refcount <= 0:
            raise NvmlReturn(UNINITIALIZED)

    def _dev(self, handle: Any, fname: str) -> FakeGpu:
        self._ensure_init()
        if isinstance(handle, int) or handle is None:
            addr = handle or 0
        else:
            addr = _addr(handle)
        epoch, pos = divmod(addr - HANDLE_BASE, HANDLE_EPOCH)
        if not 0 <= pos < len(self.gpus) or epoch < 0:
            raise NvmlReturn(INVALID_ARGUMENT)
        gpu = self.gpus[pos]
        if gpu.lost or gpu.removed or epoch != gpu.epoch:
            raise NvmlReturn(GPU_IS_LOST)
        self._check_injected(fname, gpu)
        return gpu

    def _check_injected(self, fname: str, gpu: FakeGpu | None) -> None:
        if not self._injections:
            return
        pos = None if gpu is None else self.gpus.index(gpu)
        for key in ((fname, pos), (fname, None), ("*", pos), ("*", None)):
            entry = self._injections.get(key)
            if entry is None:
                continue
            code, left = entry
            if left is not None:
                entry[1] = left - 1
                if entry[1] <= 0:
                    del self._injections[key]
            raise NvmlReturn(code)

    def _write_allowed(self) -> None:
        if not self._privileged:
            raise NvmlReturn(NO_PERMISSION)

    def _persist(self) -> None:
        if self._file is not None:
            self._file.write(
                dump_state(
                    self.gpus,
                    driver_version=self.driver_version,
                    privileged=self._privileged,
                    missing=sorted(self._missing),
                )
            )

    def _sync(self) -> None:
        """Take the control state another process wrote to the shared file."""
        if self._file is None or not self._file.changed():
            return
        try:
            data = self._file.read()
        except (OSError, ValueError):
            return
        self._privileged = data["privileged"]
        for gpu, d in zip(self.gpus, data["gpus"], strict=False):
            gpu.apply_control(d)

    # ---- simulator and test helpers (index = position in the profile list) ----
    def save(self) -> None:
        """Write the whole state (dynamic values too) to ``state_path`` now."""
        with self._lock:
            self._persist()

    @property
    def privileged(self) -> bool:
        return self._privileged

    @privileged.setter
    def privileged(self, value: bool) -> None:
        with self._lock:
            self._sync()
            self._privileged = value
            self._persist()

    def inject(self, function: str, index: int | None, code: int, count: int | None = None) -> None:
        """Make ``function`` (C name, ``"nvml"`` prefix optional, ``"*"`` for every device call) fail with
        ``code`` on GPU ``index`` (None: every GPU and device-less calls), ``count`` times (None: until
        :meth:`clear_injections`). ``NVML_ERROR_GPU_IS_LOST`` with no count loses the GPU for good."""
        with self._lock:
            if code == GPU_IS_LOST and count is None and index is not None:
                self.lose_gpu(index)
                return
            self._injections[(_c_name(function), index)] = [code, count]

    def clear_injections(self, function: str | None = None, index: int | None = None) -> None:
        """Remove every injection, or the one set for ``function`` (``"*"`` included) and ``index``."""
        with self._lock:
            if function is None:
                self._injections.clear()
            else:
                self._injections.pop((_c_name(function), index), None)

    def fail_library(self, code: int | None) -> None:
        """Make every NVML call, ``nvmlInit`` included, answer ``code`` (None: work again): the driver
        unloaded (DRIVER_NOT_LOADED), a driver upgraded under a running process (LIB_RM_VERSION_MISMATCH),
        NVML broken in a container after a cgroup reload (UNKNOWN). As with the real library, a session
        open when the failure came stays broken after it ends, until ``nvmlShutdown`` and ``nvmlInit``."""
        with self._lock:
            self.library_error = code
            if code is not None and self._refcount > 0:
                self._broken = code

    def hang(self, index: int) -> None:
        """Calls on GPU ``index`` (by handle) block until :meth:`unhang`; other GPUs answer meanwhile."""
        self._hangs.setdefault(index, threading.Event())

    def unhang(self, index: int | None = None) -> None:
        """Release the calls blocked on GPU ``index`` (None: every GPU)."""
        for i in list(self._hangs) if index is None else [index]:
            gate = self._hangs.pop(i, None)
            if gate is not None:
                gate.set()

    def cap_power(self, index: int, watts: float | None) -> None:
        """An out-of-band power cap on GPU ``index`` (a BMC, nvidia-powerd): the enforced limit is at most
        ``watts`` whatever the management limit; None lifts it."""
        with self._lock:
            self.gpus[index].cap_mw = None if watts is None else int(round(watts * 1000))


def _c_name(name: str) -> str:
    return name if name == "*" or name.startswith("nvml") else "nvml" + name


def _addr(handle: Any) -> int:
    import ctypes

    return ctypes.c_void_p.from_buffer(handle).value or 0


def _position(arg: Any) -> int | None:
    """The profile position a device handle argument names, or None when ``arg`` is no handle."""
    import ctypes

    if isinstance(arg, int) and not isinstance(arg, bool):
        offset = arg - HANDLE_BASE
    elif isinstance(arg, (ctypes._Pointer, ctypes.c_void_p)):  # noqa: SLF001 - pynvml's c_nvmlDevice_t
        offset = _addr(arg) - HANDLE_BASE
    else:
        return None
    return offset % HANDLE_EPOCH if offset >= 0 else None


_LIFECYCLE = frozenset({"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString"})
