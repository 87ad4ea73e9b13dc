"""The ``pynvml`` bindings of a daemon that may run where no NVIDIA driver is: imported when NVML can load.

``aithermd run`` opens its NVML backend on every machine, so that GPUs whose driver comes later (a module
loaded after the daemon, a driver installed while it runs) are adopted with the backend's retry and
backoff, and its health says why there is none. Importing ``pynvml`` costs ~12 ms of CPU on the way to the
first tick (issue 22, start-up), for nothing on a machine without the library. :class:`LazyNvml` stands in
for the module: while the library pynvml loads (:data:`LIBRARY`, ``pynvml._LoadNvmlLibrary`` on Linux)
cannot be loaded, ``nvmlInit()`` fails as pynvml's own does there (``NVMLError`` whose ``value`` is
``NVML_ERROR_LIBRARY_NOT_FOUND``) without importing it; once the library loads, or as soon as any other
name is asked, ``pynvml`` is imported and every name is looked up on it from then on (live, nothing
copied), so the bindings behave exactly as the module does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

LIBRARY = "libnvidia-ml.so.1"  # what pynvml's _LoadNvmlLibrary loads on Linux
LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND (nvml.h; a test holds it equal to pynvml's)
_STAND_INS = ("NVMLError", "NVML_ERROR_LIBRARY_NOT_FOUND", "nvmlLib", "nvmlInit")


class NotLoaded(Exception):
    """``nvmlInit()`` of :class:`LazyNvml` while the library cannot be loaded; ``value``: the NVML code, as
    on ``pynvml.NVMLError``."""

    def __init__(self, value: int = LIBRARY_NOT_FOUND) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return "Library Not Found"  # pynvml's text for this code


def library_loads(name: str = LIBRARY) -> bool:
    """Whether the dynamic loader can load ``name`` now (what pynvml does first in ``nvmlInit``)."""
    import ctypes  # pynvml imports it too; only here, not at the daemon's start

    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


class LazyNvml:
    """``pynvml``, imported only once NVML can load (see the module doc). ``loads()``: whether the library
    can be loaded now (default :func:`library_loads`). ``on_load(fn)``: ``fn(pynvml)`` once it is imported
    (at once if it is). ``loaded``: whether it is."""

    def __init__(self, loads: Callable[[], bool] = library_loads) -> None:
        self._module: Any = None
        self._loads = loads
        self._hooks: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        # the stand-ins, as instance attributes until pynvml is imported; removed then, so that every later
        # lookup falls through to __getattr__ and pynvml
        self.NVMLError = NotLoaded
        self.NVML_ERROR_LIBRARY_NOT_FOUND = LIBRARY_NOT_FOUND
        self.nvmlLib = None
        self.nvmlInit = self._init

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def on_load(self, fn: Callable[[Any], None]) -> None:
        if self._module is not None:
            fn(self._module)
        else:
            self._hooks.append(fn)

    def _init(self) -> None:
        if not self._loads():
            raise NotLoaded(LIBRARY_NOT_FOUND)
        self._load().nvmlInit()

    def _load(self) -> Any:
        with self._lock:
            if self._module is None:
                import pynvml

                for name in _STAND_INS:
                    self.__dict__.pop(name, None)
                self._module = pynvml
                for fn in self._hooks:
                    fn(pynvml)
                self._hooks = []
        return self._module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_module", "_loads", "_hooks", "_lock"):
            raise AttributeError(name)  # protocols probed by copy, pickle, mocks; attributes not set yet
        return getattr(self._load(), name)

    def __dir__(self) -> list[str]:
        return dir(self._module) if self._module is not None else list(_STAND_INS)

    def __repr__(self) -> str:
        return f"<LazyNvml {'loaded' if self._module is not None else 'not loaded'}>"
