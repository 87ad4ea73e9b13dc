"""A hand-off's end on bare locks, for :meth:`aithermd.backends.nvml_worker.NvmlWorker.each` (the one pass
a tick makes over the GPUs)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import structlog


class Pass:
    """What :meth:`NvmlWorker.each` and the thread use of a Future, on bare locks: a concurrent.futures
    Future and its Condition (pure Python, a lock allocated per wait) cost the reading thread and the worker
    about twice the CPU per hand-off at 1 Hz (as :class:`aithermd.backends.guard._Reader` found)."""

    __slots__ = ("_over", "_mutex", "_state", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self._over = threading.Lock()  # held until the call ended
        self._over.acquire()
        self._mutex = threading.Lock()  # between the call ending and a callback being added
        self._state = 0  # 0 queued, 1 running, 2 done
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], None]] = []

    def set_running_or_notify_cancel(self) -> bool:
        self._state = 1
        return True

    def running(self) -> bool:
        return self._state == 1

    def done(self) -> bool:
        return self._state == 2

    def set_result(self, value: Any) -> None:
        self._end(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._end(None, error)

    def _end(self, value: Any, error: BaseException | None) -> None:
        with self._mutex:
            if self._state == 2:  # ended already: the first end stands
                return
            self._state, self._value, self._error = 2, value, error
            callbacks, self._callbacks = self._callbacks, []
        self._over.release()
        for fn in callbacks:
            self._call(fn)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._mutex:
            if self._state != 2:
                self._callbacks.append(fn)
                return
        self._call(fn)

    def _call(self, fn: Callable[[Any], None]) -> None:
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as a Future's callback: logged, never raised in the caller
            structlog.get_logger("aithermd.nvml").exception("callback_failed")

    def result(self, timeout: float | None = None) -> Any:
        """The call's value (its exception raised here); FutureTimeout after ``timeout`` s."""
        if not self._over.acquire(timeout=-1 if timeout is None else timeout):
            raise FutureTimeout
        self._over.release()
        if self._error is not None:
            raise self._error
        return self._value

