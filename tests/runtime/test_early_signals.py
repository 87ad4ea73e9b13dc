"""Signals that arrive while the daemon starts are kept and handed to it (a stop during start-up is a clean
stop, not death by SIGTERM's default action); the previous handlers come back afterwards."""

from __future__ import annotations

import asyncio
import os
import signal

from aithermd.runtime.signals import SIGNALS, Signals


async def test_signals_before_the_loop_are_handed_to_it_in_order_then_handlers_restored():
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    early = Signals.catch()
    calls: list[str] = []
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process with the default action
        assert early.pending == [signal.SIGHUP, signal.SIGTERM]
        early.attach(asyncio.get_running_loop(), lambda: calls.append("stop"), lambda: calls.append("reload"))
        assert calls == ["reload", "stop"]
        os.kill(os.getpid(), signal.SIGINT)  # once attached, straight to the loop
        for _ in range(100):
            if len(calls) == 3:
                break
            await asyncio.sleep(0.01)
        assert calls == ["reload", "stop", "stop"]
        early.detach()
        os.kill(os.getpid(), signal.SIGINT)  # after the loop let go: kept, never a KeyboardInterrupt
        assert early.pending == [signal.SIGINT]
    finally:
        early.close()
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == before


def test_outside_the_main_thread_nothing_is_installed():
    import threading

    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    caught: list[Signals] = []
    thread = threading.Thread(target=lambda: caught.append(Signals.catch()))
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == before
    caught[0].close()
