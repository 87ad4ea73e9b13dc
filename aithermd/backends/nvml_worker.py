"""One dedicated thread that owns every NVML call.

NVML calls are blocking C calls (a GPU falling off the bus can hold one for seconds), so none may run on
the asyncio loop. Every call the NVML backend makes goes through one :class:`NvmlWorker`: ``await
worker.call(fn, *args)`` from the loop, ``worker.run(fn, *args)`` from another thread (the daemon's
sampling executor, a command). Calls run one at a time, in order; a call made from the worker thread itself
runs at once (no deadlock when a worker job calls back in).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from aithermd.errors import BackendTimeout

T = TypeVar("T")


class NvmlWorker:
    """A single-thread executor for NVML calls. ``timeout_s``: the default deadline of one call; a call
    that misses it raises :class:`~aithermd.errors.BackendTimeout` (the thread stays busy with it)."""

    def __init__(self, name: str = "nvml", timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident: int | None = None
        self._closed = False

    def _enter(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        self._ident = threading.get_ident()
        return fn(*args)

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> Future[T]:
        if self._closed:
            raise RuntimeError("NVML worker is closed")
        return self._executor.submit(self._enter, fn, args)

    @property
    def on_worker(self) -> bool:
        """True when the caller is the worker thread itself."""
        return self._ident is not None and threading.get_ident() == self._ident

    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """Run ``fn(*args)`` on the worker and wait for it (blocking the calling thread, never the loop's
        own: call :meth:`call` there). Exceptions propagate; a missed deadline raises BackendTimeout."""
        if self.on_worker:
            return fn(*args)
        future = self._submit(fn, args)
        deadline = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=deadline)
        except FutureTimeout:
            raise BackendTimeout(
                f"NVML call {getattr(fn, '__name__', fn)!s} took over {deadline:g} s"
            ) from None

    async def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """``await`` ``fn(*args)`` run on the worker; the loop keeps running meanwhile."""
        if self.on_worker:
            return fn(*args)
        future = asyncio.wrap_future(self._submit(fn, args))
        deadline = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            raise BackendTimeout(
                f"NVML call {getattr(fn, '__name__', fn)!s} took over {deadline:g} s"
            ) from None

    def close(self) -> None:
        """Finish queued calls and stop the thread; later calls raise RuntimeError."""
        if not self._closed:
            self._closed = True
            self._executor.shutdown(wait=not self.on_worker)
