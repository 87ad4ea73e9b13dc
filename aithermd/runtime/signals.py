"""Stop and reload signals, from the first line of ``aithermd run`` to its last.

SIGTERM and SIGINT ask the daemon to stop (every journaled knob restored, exit 0); SIGHUP asks it to reload
its policies. Left to Python's defaults, a SIGTERM during start-up kills the process with nothing restored,
and a SIGINT raises KeyboardInterrupt wherever the main thread happens to be (exit 130). So ``aithermd run``
catches them first thing (:meth:`Signals.catch`): until the daemon's event loop takes them over
(:meth:`Signals.attach`, the first line of :meth:`~aithermd.runtime.daemon.Daemon.run`) each one is only
remembered, and the loop then acts on what arrived meanwhile, in order. A stop that arrives during
start-up therefore ends the daemon as any stop does: no service starts, no tick runs, whatever start-up
wrote is restored, exit 0. When the loop lets go (:meth:`Signals.detach`) they are remembered again until
:meth:`Signals.close` puts back the handlers found at :meth:`Signals.catch`, so a late Ctrl-C cannot turn
a clean exit into 130. A daemon run inside another program (the simulator, a test) without an early catch
gets the handlers found at :meth:`Signals.attach` back at :meth:`Signals.detach`.

Signal handlers can only be installed from the main thread; elsewhere every method does nothing. Before
:meth:`Signals.catch` runs (the interpreter starting, the command line being parsed) nothing has been
written; a signal there ends the process with the default action.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

STOP = (signal.SIGTERM, signal.SIGINT)
RELOAD = (signal.SIGHUP,)
SIGNALS = (*STOP, *RELOAD)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Signals:
    """SIGTERM, SIGINT and SIGHUP of this process. ``pending``: the signals that arrived while no loop held
    them, oldest first."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._caught: dict[int, Any] = {}  # the handlers found by catch(), put back by close()
        self._before: dict[int, Any] = {}  # the handlers found by attach() without catch()
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def catch(cls) -> Signals:
        """Start remembering the signals (call before anything is read or written)."""
        signals = cls()
        if _main_thread():
            signals._caught = {sig: signal.getsignal(sig) for sig in SIGNALS}
            signals._remember_all()
        return signals

    def _remember(self, signum: int, _frame: Any) -> None:
        self.pending.append(signum)

    def _remember_all(self) -> None:
        # SIGTERM last: once it is caught (what a supervisor or test sees in /proc/PID/status SigCgt) every
        # other is too; a SIGINT between the two installs raised KeyboardInterrupt and exited 130 (a CI flake)
        for sig in sorted(SIGNALS, key=lambda s: s == signal.SIGTERM):
            signal.signal(sig, self._remember)

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None],
               reload: Callable[[], None]) -> None:
        """Hand the signals to ``loop``: ``stop()`` on SIGTERM/SIGINT, ``reload()`` on SIGHUP (both called on
        the loop); what arrived before is acted on now, in order."""
        if not _main_thread():
            return
        if not self._caught:
            self._before = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in STOP:
            loop.add_signal_handler(sig, stop)
        for sig in RELOAD:
            loop.add_signal_handler(sig, reload)
        self._loop = loop
        pending, self.pending = self.pending, []
        for sig in pending:
            (stop if sig in STOP else reload)()

    def detach(self) -> None:
        """Take the signals back from the loop: remembered from now on after :meth:`catch`, else the
        handlers found at :meth:`attach` put back."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        if self._caught:
            self._remember_all()
        else:
            self._restore(self._before)

    def close(self) -> None:
        """Put back the handlers :meth:`catch` found (the command is done)."""
        self.detach()
        caught, self._caught = self._caught, {}
        self._restore(caught)

    @staticmethod
    def _restore(handlers: dict[int, Any]) -> None:
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
