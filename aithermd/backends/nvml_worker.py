"""The thread that owns every NVML call, with a deadline per GPU so that one hung GPU holds up no other.

NVML calls are blocking C calls, and a GPU falling off the bus (Xid 79), a driver in recovery or a hung
RM lock can hold one for seconds or for ever. None may run on the asyncio loop: every call the NVML
backend makes goes through one :class:`NvmlWorker`: ``await worker.call(fn, *args)`` from the loop,
``worker.run(fn, *args)`` from another thread (the daemon's sampling worker, a command). Calls run one at a
time, in order, on one thread; a call made from the worker thread itself runs at once.

**A hung GPU.** A call made for a GPU (``gpu="gpu1"``) that misses its deadline marks that GPU *hung* and
leaves the stuck thread behind: later calls run on a fresh thread, so the other GPUs go on being read and
written; calls for the hung GPU fail at once with :class:`~aithermd.errors.BackendTimeout` until the stuck
call returns (then the GPU is free again and its abandoned thread ends). The calls queued behind the stuck
one move to the fresh thread: none is cancelled (a restore of a healthy GPU queued behind a hung one is
made, not dropped), and those for the hung GPU fail with BackendTimeout. A call still queued when its
deadline passes is not blamed on its own GPU: it waits behind another caller's call, which is left behind
(and the queue moved) once the worker has begun no NVML call for that deadline. :meth:`NvmlWorker.each` reads
many GPUs in one pass on the thread (one hand-off per tick in the normal case): a GPU whose read makes no
progress within the deadline (no NVML call began: :meth:`NvmlWorker.beat`) is marked hung and the pass goes
on with the GPUs after it on a fresh thread. :meth:`NvmlWorker.poll` is the same pass for a watcher that
waits a few milliseconds at most (one job for every watched GPU). The one NVML call made elsewhere is the
fast lane's temperature read on its own polling thread (NVML is thread-safe), several times a second near a
trigger, where a hand-off would cost more than the read: it has a deadline of its own
(:mod:`aithermd.watchers.lanegpus`) and skips the GPUs this worker holds hung.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import structlog

from aithermd.backends.nvml_pass import Pass
from aithermd.errors import BackendTimeout

T = TypeVar("T")
HUNG = "{gpu}: an earlier NVML call has not returned (the GPU is hung)"
DEADLINE_S = 2.0  # an NVML query answers in µs to ms; nvmlInit attaching every GPU can take ~1 s


class _Thread:
    """One daemon thread running submitted calls in order (a daemon thread: one stuck in a hung NVML call
    never holds up the process's exit, as a _Thread's thread would)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.running: Future[Any] | None = None  # the future of the call running now
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, gpu: str | None = None) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((fn, args, future, gpu))
        return future

    def put(self, job: tuple[Any, ...]) -> None:
        self._jobs.put(job)

    def take(self) -> list[tuple[Any, ...]]:
        """Every job still queued (fn, args, future, gpu), taken off the queue."""
        jobs = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return jobs
            if job is not None:
                jobs.append(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, future, _gpu = job
            if not future.set_running_or_notify_cancel():
                continue
            self.running = future
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            self.running = None

    def shutdown(self, *, wait: bool = False) -> None:
        self._jobs.put(None)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


class NvmlWorker:
    """NVML calls on one thread at a time (see the module doc). ``timeout_s``: the default deadline of a
    call (s)."""

    def __init__(self, name: str = "nvml", timeout_s: float = DEADLINE_S) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._executor: _Thread | None = None
        self._generation = 0
        self._local = threading.local()
        self._lock = threading.Lock()
        self._hung: dict[str, float] = {}  # gpu → monotonic time its call went unanswered
        self._held: set[str] = set()  # of those, held by the read guard as slow (hold()): none stuck here
        self.hangs = 0  # calls abandoned since the start
        self._beat = 0.0  # monotonic time the last NVML call began (readers call beat())
        self._closed = False
        self._poll_job: tuple[Future[Any], dict[str, Any], _Thread] | None = None  # a poll() not yet ended
        self._log = structlog.get_logger("aithermd.nvml")

    # -- the thread ------------------------------------------------------------------------------------
    def _current(self) -> _Thread:
        with self._lock:
            if self._closed:
                raise RuntimeError("NVML worker is closed")
            if self._executor is None:
                self._generation += 1
                self._executor = _Thread(f"{self.name}-{self._generation}")
            return self._executor

    def _abandon(self, executor: _Thread) -> None:
        """Leave ``executor``'s stuck thread behind (it ends once its call returns); the calls queued on it
        move to a fresh thread, those for a GPU hung now fail with BackendTimeout."""
        with self._lock:
            if self._executor is executor:
                self._executor = None
        queued = executor.take()
        executor.shutdown(wait=False)
        for fn, args, future, gpu in queued:
            try:
                if gpu is not None and gpu in self._hung:
                    raise BackendTimeout(HUNG.format(gpu=gpu))
                self._current().put((fn, args, future, gpu))
            except (BackendTimeout, RuntimeError) as exc:  # RuntimeError: the worker closed meanwhile
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)

    def _behind(self, future: Future[Any], deadline: float) -> bool:
        """Whether ``future``'s call, past its deadline, has not begun: it waits behind another caller's
        call. That call is left behind (:meth:`_abandon`, the queue moved to a fresh thread) once the
        worker has begun no NVML call for ``deadline`` s; it is not blamed on ``future``'s GPU."""
        if future.running() or future.done():
            return False
        executor = self._executor
        if executor is not None and time.monotonic() - self._beat >= deadline:
            self._abandon(executor)
        return True

    def _holder(self, future: Future[Any], executor: _Thread) -> _Thread:
        """The thread running ``future`` (the one it was submitted to, or the fresh one it moved to)."""
        current = self._executor
        return current if current is not None and current.running is future else executor

    def _enter(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        self._local.inside = True
        return fn(*args)

    @property
    def on_worker(self) -> bool:
        """True when the caller is a worker thread itself."""
        return bool(getattr(self._local, "inside", False))

    def beat(self) -> None:
        """Note that an NVML call begins: :meth:`each` times the deadline from the last call, so a GPU whose
        read is slow (a loaded machine, many calls) is never taken for a hung one while its calls return."""
        self._beat = time.monotonic()

    # -- hung GPUs -------------------------------------------------------------------------------------
    def hung(self, gpu: str) -> float | None:
        """When (monotonic s) ``gpu``'s unanswered call was given up on, or None when it is not hung."""
        return self._hung.get(gpu)

    @property
    def hung_gpus(self) -> frozenset[str]:
        return frozenset(self._hung)

    def _mark_hung(self, gpu: str, future: Future[Any], what: str, deadline: float) -> None:
        self.hangs += 1
        self._hung[gpu] = time.monotonic()
        self._held.discard(gpu)
        self._log.error("nvml_call_hung", gpu=gpu, call=what, deadline_s=deadline,
                        message=f"{gpu}: NVML call {what} did not return within {deadline:g} s; the other "
                                "GPUs are served by a fresh thread")

        def returned(_: Future[Any]) -> None:
            if self._hung.pop(gpu, None) is not None:
                self._log.warning("nvml_call_returned", gpu=gpu, call=what)

        future.add_done_callback(returned)

    def hold(self, gpu: str, what: str, deadline: float, slow: bool = False) -> None:
        """Hold ``gpu`` hung: its read ``what`` made no answer within ``deadline`` s off the worker (on the
        read guard's thread, :mod:`aithermd.backends.nvml_pass`); :meth:`free` once it returned. ``slow``:
        its calls answer, but its read overran its budget (tried by a call with ``held_too``)."""
        self.hangs += 1
        if slow and gpu not in self._hung:
            self._held.add(gpu)
        self._hung[gpu] = time.monotonic()
        self._log.error("nvml_call_hung", gpu=gpu, call=what, deadline_s=deadline,
                        message=f"{gpu}: its read took over {deadline:g} s (its NVML calls answer, slowly); "
                                "the other GPUs are read by a fresh thread" if slow else
                                f"{gpu}: NVML call {what} did not return within {deadline:g} s; the other "
                                "GPUs are read by a fresh thread")

    def free(self, gpu: str) -> bool:
        """``gpu``'s hung call returned: it is served again. False when it was not held."""
        self._held.discard(gpu)
        if self._hung.pop(gpu, None) is None:
            return False
        self._log.warning("nvml_call_returned", gpu=gpu, call="read")
        return True

    def _refuse_hung(self, gpu: str | None, refuse_held: bool = True) -> None:
        if gpu is not None and gpu in self._hung and (refuse_held or gpu not in self._held):
            raise BackendTimeout(HUNG.format(gpu=gpu))

    # -- calls -----------------------------------------------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None,
            gpu: str | None = None, held_too: bool = False) -> T:
        """Run ``fn(*args)`` on the worker and wait for it (blocking the calling thread, never the loop's
        own: call :meth:`call` there). Exceptions propagate; a missed deadline raises BackendTimeout (and
        marks ``gpu`` hung). A call for a hung ``gpu`` is refused at once, but with ``held_too`` one for a
        GPU the read guard holds as slow (:meth:`hold`: a read on its thread overran its budget while its
        calls answered: the restores at the stop) is tried under its deadline."""
        if self.on_worker:
            return fn(*args)
        self._refuse_hung(gpu, not held_too)
        executor = self._current()
        future = executor.submit(self._enter, fn, args, gpu=gpu)
        deadline = self.timeout_s if timeout_s is None else timeout_s
        while True:
            try:
                return future.result(timeout=deadline)
            except FutureTimeout:
                if not self._behind(future, deadline):
                    raise self._timed_out(self._holder(future, executor), future, fn, deadline, gpu) from None

    async def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None,
                   gpu: str | None = None) -> T:
        """``await`` ``fn(*args)`` run on the worker; the loop keeps running meanwhile."""
        if self.on_worker:
            return fn(*args)
        self._refuse_hung(gpu)
        executor = self._current()
        cf = executor.submit(self._enter, fn, args, gpu=gpu)
        waiter = asyncio.wrap_future(cf)
        deadline = self.timeout_s if timeout_s is None else timeout_s
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), deadline)
            except TimeoutError:
                if not self._behind(cf, deadline):
                    raise self._timed_out(self._holder(cf, executor), cf, fn, deadline, gpu) from None

    def _timed_out(self, executor: _Thread, future: Future[Any], fn: Callable[..., Any],
                   deadline: float, gpu: str | None) -> BackendTimeout:
        what = getattr(fn, "__name__", str(fn))
        if gpu is not None:
            self._mark_hung(gpu, future, what, deadline)
        self._abandon(executor)
        return BackendTimeout(f"NVML call {what} took over {deadline:g} s" + (f" on {gpu}" if gpu else ""))

    def each(self, items: Iterable[tuple[str, T]], fn: Callable[[T], Any],
             timeout_s: float | None = None) -> dict[str, Any]:
        """``fn(item)`` for each ``(gpu, item)`` whose GPU is not hung, in order, on the worker; returns
        {gpu: result}. A GPU whose ``fn`` makes no answer within the deadline is marked hung and left out;
        the GPUs after it are read on a fresh thread. ``fn`` should not raise (an exception ends the pass
        and propagates)."""
        pending = [(g, it) for g, it in items if g not in self._hung]
        deadline = self.timeout_s if timeout_s is None else timeout_s
        if self.on_worker:
            return {g: fn(it) for g, it in pending}
        results: dict[str, Any] = {}
        while pending:
            state: dict[str, Any] = {"gpu": None, "since": time.monotonic(), "stop": False}
            done: dict[str, Any] = {}

            def one_pass(todo: list[tuple[str, T]] = pending, state: dict[str, Any] = state,
                         done: dict[str, Any] = done) -> None:
                for g, it in todo:
                    if state["stop"]:
                        return
                    if g in self._hung:  # hung since (this pass moved to a fresh thread): not asked
                        continue
                    state["gpu"], state["since"] = g, time.monotonic()
                    value = fn(it)
                    if not state["stop"]:
                        done[g] = value
                state["gpu"] = None

            executor, future = self._current(), Pass()
            executor.put((self._enter, (one_pass, ()), future, None))
            while True:
                wait = max(state["since"], self._beat) + deadline - time.monotonic()
                try:
                    future.result(timeout=max(0.0, wait))
                    break
                except FutureTimeout:
                    if time.monotonic() - max(state["since"], self._beat) < deadline:
                        continue  # the pass moved on to another GPU or call meanwhile: its deadline counts
                    state["stop"] = True
                    stuck = state["gpu"]
                    if stuck is not None:
                        self._mark_hung(stuck, future, getattr(fn, "__name__", "read"), deadline)
                    self._abandon(executor)
                    break
            results.update(done)
            if not state["stop"]:
                break
            pending = [(g, it) for g, it in pending if g not in results and g not in self._hung]
        return results

    def poll(self, items: Iterable[tuple[str, T]], fn: Callable[[T], Any], wait_s: float,
             deadline_s: float | None = None) -> dict[str, Any] | None:
        """``fn(item)`` for each ``(gpu, item)`` whose GPU is not hung, in one job on the worker, for a
        watcher that must never wait long (the fast lane): waits ``wait_s`` at most and returns {gpu:
        result}, or None when the job did not end in time. A job that did not end is left to finish (no GPU
        is marked hung for a wait cut short: the thread may only be busy with the tick's pass) and no other
        poll starts until it has; one that makes no progress for ``deadline_s`` (default: the worker's)
        while reading a GPU marks that GPU hung, as :meth:`each` does, and the next poll runs on a fresh
        thread without it. ``fn`` should not raise."""
        deadline = self.timeout_s if deadline_s is None else deadline_s
        job = self._poll_job
        if job is not None and not job[0].done():
            future, state, executor = job
            stuck = state["gpu"]
            if stuck is None or time.monotonic() - max(state["since"], self._beat) < deadline:
                return None  # still queued or running: no second poll behind it
            state["stop"] = True
            self._mark_hung(stuck, future, getattr(fn, "__name__", "poll"), deadline)
            self._abandon(executor)
        self._poll_job = None
        todo = [(g, it) for g, it in items if g not in self._hung]
        if self.on_worker:
            return {g: fn(it) for g, it in todo}
        state: dict[str, Any] = {"gpu": None, "since": time.monotonic(), "stop": False}
        done: dict[str, Any] = {}

        def one_pass() -> dict[str, Any]:
            for g, it in todo:
                if state["stop"]:
                    break
                if g in self._hung:  # hung since (this job moved to a fresh thread): not asked
                    continue
                state["gpu"], state["since"] = g, time.monotonic()
                done[g] = fn(it)
            state["gpu"] = None
            return done

        executor = self._current()
        future = executor.submit(self._enter, one_pass, ())
        try:
            return future.result(timeout=wait_s)
        except FutureTimeout:
            self._poll_job = (future, state, executor)
            return None
        except CancelledError:  # queued on a thread the tick's pass left behind (a GPU hung meanwhile)
            return None

    def close(self) -> None:
        """Finish queued calls and stop the thread; later calls raise RuntimeError (a hung thread is left
        to end on its own)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=not self.on_worker and not self._hung)
