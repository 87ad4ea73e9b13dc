"""Inline knob writes off the loop, under a deadline per knob (attack10 W1).

A knob of an inline backend (hwmon, powercap) is a sysfs file whose ``store()`` — and whose read-back — can
block for ever on a driver's lock (a stuck Super I/O chip, an EC, a wedged USB fan hub). On the event loop
that would stop the tick, the safety layer, D-Bus and SIGTERM with it. So the executor settles on the loop
only what needs no backend call (a value already in place: a tick that writes nothing hops nowhere), and
hands the rest — the writes with their read-backs, the hand-backs — to :class:`InlineWrites`: one batch in
its writer thread, waited for with a plain wait (no asyncio hop, as the read guard waits for its reads),
``deadline_s`` at most per knob from when that knob's turn began. When a knob's write does not return in
time:

- its device is held *write hung* (:class:`~aithermd.actuate.hung.Unanswered`): nothing more is written to
  it or read back from it, and its knobs carry the ``uncontrollable`` alarm, until the write returns;
- a ``write_hung`` fault is raised, and the thread is left behind: once its call returns it writes nothing
  more of that batch;
- the rest of the batch — every other device's knobs, the safety layer's decisions included — runs at once
  on a new thread under the same rule: one hung device costs the tick ``deadline_s``, never the others'
  writes;
- the write is tracked as the worker's NVML writes are (:class:`~aithermd.actuate.execute.Executor`): the
  final restore does not wait for it and leaves its device's knobs journaled for ``aithermd restore``
  while it has not returned, and restores them if it returned meanwhile.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import structlog

WRITE_DEADLINE_S = 0.5  # a sysfs store answers in µs, an EC or a USB hub in ms: 0.5 s is a hang
THREAD_NAME = "aithermd-writes"

_log = structlog.get_logger("aithermd.inline")


class _Writer:
    """One daemon thread running the batches handed to it in turn (it never holds up the process's exit).

    A daemon thread loses no journaled state at exit: the loop waits for each batch, so at the exit the
    thread is idle or in a batch given up on (its call stuck in the driver; the kernel lets the process end
    only once that call returns, and the batch writes nothing more). A knob's original is on disk before its
    write (journal first), and the journal is replaced atomically, so a thread ended in a hand-back leaves
    the entry, restored again later (hang8)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        threading.Thread(target=self._run, name=THREAD_NAME, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting loop
                future.set_exception(exc)

    def stop(self) -> None:
        """End the thread once the batch it runs (if any) returns."""
        self._jobs.put(None)


class InlineWrites:
    """The writer thread of the inline knobs (see the module doc); ``hangs`` counts the writes given up on."""

    def __init__(self, deadline_s: float = WRITE_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self.hangs = 0
        self._pool: _Writer | None = None

    def run(self, batch: Callable[..., Any], job: Any, *args: Any) -> Future[Any] | None:
        """``batch(*args)`` in the writer thread, ``job`` its progress (``writing``: the knob inside a backend
        call, ``since``: when its turn began, monotonic s). Returns None once it is over, or the future of
        the batch given up on: ``job.stuck``, the knob it was writing, did not return within ``deadline_s``
        (``job.cut`` is set: the batch writes nothing more once that call returns; the caller runs what is
        left on a new thread)."""
        pool = self._pool
        if pool is None:
            pool = self._pool = _Writer()
        begun = time.monotonic()
        future = pool.submit(batch, *args)
        while True:
            wait = (job.since or begun) + self.deadline_s - time.monotonic()
            if wait <= 0 and job.writing is None:  # between knobs or not begun (a busy CPU), past the last
                wait = self.deadline_s  # knob's deadline: nothing to give up on; no busy wait (hang8)
            try:
                future.result(timeout=max(0.0, wait))
                return None
            except TimeoutError:
                if future.done() or job.writing is None or time.monotonic() < job.since + self.deadline_s:
                    continue  # it moved on meanwhile, or it is between two knobs (or not begun: a busy CPU)
            job.stuck, job.cut = job.writing, True  # (were it to return just now, its device is freed later)
            self.hangs += 1
            self._pool = None  # the stuck thread ends once its call returns; the next batch gets a new one
            pool.stop()
            _log.error("write_hung", knob=job.stuck, deadline_s=self.deadline_s)
            return future

    def close(self) -> None:
        """Let the writer thread end (a stuck one ends when its call returns; it never holds the exit)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool = None


def rest(order: Sequence[str], stuck: str) -> set[str]:
    """The knob ids of ``order`` after ``stuck`` (not begun when the batch was given up on)."""
    return set(order[order.index(stuck) + 1:]) if stuck in order else set()
