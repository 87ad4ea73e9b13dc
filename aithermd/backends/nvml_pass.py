"""The one pass a tick makes over the GPUs: read on the read guard's thread itself (:class:`Inline`), or
handed to the NVML worker (:meth:`aithermd.backends.nvml_worker.NvmlWorker.each`), whose hand-off ends on
bare locks (:class:`Pass`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import structlog

from aithermd.backends.guard import guarded


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



class Inline:
    """The tick's reads of the healthy GPUs made on the read guard's thread itself, where it waits for them
    (:func:`~aithermd.backends.guard.guarded`): no hand-off to the worker and back, two thread wake-ups a
    tick fewer (each ~0.1 ms of CPU at 1 Hz on a VM). The guard keeps what the worker's deadline per GPU
    gave: ``reading`` is the GPU being read, ``hung_at()`` when it counts as hung: ``deadline_s`` after its
    read or its last NVML call began (:meth:`NvmlWorker.beat`), but ``budget_s`` after its read began at the
    latest (attack11 G1: a GPU whose every call takes just under the deadline held the loop for its whole
    read, seconds, every tick). ``skip`` the GPUs held hung on the worker (their knobs refused, their
    readings stale): while a read that overran has not returned, and for a back-off once a GPU overran at
    each of its last passes (:mod:`aithermd.backends.hangs`; ``backoff`` says why). Such a GPU is not
    written either: each write to a GPU that slow would hold up the worker, and the other GPUs' safety
    writes queued behind it, for seconds. A GPU whose read overruns is held, the rest of the pass runs on a
    new thread at the same tick, and once the read returns the GPU is read again. Off the guard's thread
    (a test, a command), or while the worker changes NVML's handles (``handles``), the pass is the worker's
    :meth:`NvmlWorker.each`."""

    def __init__(self, worker: Callable[[], Any], deadline_s: float, handles: Any,
                 budget_s: float | None = None) -> None:
        self._worker, self.deadline_s, self.handles = worker, deadline_s, handles
        self.budget_s = deadline_s if budget_s is None else budget_s
        self.reading: str | None = None
        self.since = 0.0
        self.backoff: dict[str, str] = {}  # gpu → why, for the GPUs held hung for a back-off
        self.skip = _Held(self)

    def hung_at(self) -> float | None:
        if self.reading is None:
            return None
        since = self.since
        return min(max(since, self._worker()._beat) + self.deadline_s, since + self.budget_s)

    def each(self, items: Iterable[tuple[str, Any]], fn: Callable[[Any], Any]) -> dict[str, Any] | None:
        """``fn(item)`` for each ``(gpu, item)`` whose GPU is not held: {gpu: result}; None when the guard
        gave up on this pass (a GPU overran: the next pass reads the rest)."""
        worker = self._worker()
        if not guarded() or not self.handles.enter():
            return worker.each(items, fn, self.deadline_s)
        out: dict[str, Any] = {}
        try:
            for g, it in items:
                if not guarded():  # given up on: the next pass reads the rest
                    break
                if worker.hung(g) is None:
                    self.since, self.reading = time.monotonic(), g
                    out[g] = fn(it)
        finally:
            self.handles.leave()
        if not guarded():
            return None
        self.reading = None
        return out


class _Held:
    """``Inline.skip``: the guard holds a GPU hung here (on the worker) while its read that overran has not
    returned, or for a back-off (the guard's why begins ``read slow``: ``Inline.backoff``), and frees it."""

    def __init__(self, owner: Inline) -> None:
        self._owner = owner

    def __setitem__(self, gpu: str, why: str) -> None:
        owner, worker = self._owner, self._owner._worker()
        owner.reading = None  # the next pass's own reads count from when they begin
        if why.startswith("read slow"):  # its read returned: held on for a back-off
            owner.backoff[gpu] = why
            if worker.hung(gpu) is not None:
                return
        # over its budget while its calls answer (a restore at the stop is still tried), or a call hangs
        slow = time.monotonic() - max(owner.since, worker._beat) < owner.deadline_s
        worker.hold(gpu, "read", owner.budget_s if slow else owner.deadline_s, slow)

    def pop(self, gpu: str, default: Any = None) -> Any:
        owner = self._owner
        owner.backoff.pop(gpu, None)
        return gpu if owner._worker().free(gpu) else default

    def get(self, gpu: str, default: Any = None) -> Any:
        owner = self._owner
        if owner._worker().hung(gpu) is None:
            return default
        return owner.backoff.get(gpu) or f"NVML call hung: no answer within {owner.deadline_s:g} s"

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner._worker().hung_gpus)

    def __len__(self) -> int:
        return len(self._owner._worker().hung_gpus)
