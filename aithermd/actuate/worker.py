"""The loop's worker thread: where calls to blocking backends (NVML) run, one job at a time.

A job is awaited under a budget (:meth:`Worker.hop`): when it takes longer it goes on in the background and
the caller gets None, so a hung NVML call never stalls the event loop by more than the budget. While a
job that missed its budget is still running, :meth:`Worker.hop` answers None at once (the thread is
busy; queueing behind a hung call would only pile up work).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

THREAD_NAME = "aithermd-worker"


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Fetch a background job's outcome so asyncio never warns it was not retrieved."""
    if not future.cancelled():
        future.exception()


class Worker:
    """One worker thread (``executor``: default a single-thread pool named ``aithermd-worker``) and the
    ``budget_s`` (s) a hop is awaited for."""

    def __init__(self, budget_s: float, executor: Executor | None = None) -> None:
        self.budget_s = budget_s
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._busy: asyncio.Future[Any] | None = None

    @property
    def busy(self) -> bool:
        """True while a job that missed its budget is still running."""
        return self._busy is not None and not self._busy.done()

    async def hop(self, fn: Callable[..., Any], *args: Any, budget_s: float | None = None,
                  submitted: Callable[[asyncio.Future[Any]], None] | None = None) -> Any:
        """``fn(*args)`` in the worker thread, awaited for ``budget_s`` (default :attr:`budget_s`); None when
        the worker is still busy with an earlier job, or this one took longer (it finishes in the
        background). ``submitted(future)`` is told of the job as it is queued (to track it until it
        returns). Exceptions of ``fn`` propagate."""
        if self.busy:
            return None
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        if submitted is not None:
            submitted(future)
        try:
            budget = self.budget_s if budget_s is None else budget_s
            return await asyncio.wait_for(asyncio.shield(future), budget)
        except TimeoutError:
            self._busy = future
            future.add_done_callback(_retrieve)
            return None

    def shutdown(self) -> None:
        """Stop taking jobs; a job still running is left to finish (never waited for)."""
        self.executor.shutdown(wait=False)
