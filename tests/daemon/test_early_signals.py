"""Signals that arrive while the daemon starts are kept and handed to it (a stop during start-up is a clean
stop, not death by SIGTERM's default action); the previous handlers come back afterwards."""

from __future__ import annotations

import os
import signal

from aithermd.commands.run import EarlySignals


class Stub:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def request_stop(self) -> None:
        self.calls.append("stop")

    def request_reload(self) -> None:
        self.calls.append("reload")


def test_signals_before_the_daemon_exists_are_handed_to_it_then_handlers_restored():
    before = {sig: signal.getsignal(sig) for sig in EarlySignals.SIGNALS}
    early = EarlySignals()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process with the default action
        assert early.pending == [signal.SIGHUP, signal.SIGTERM]
        daemon = Stub()
        early.attach(daemon)
        assert daemon.calls == ["reload", "stop"]
        os.kill(os.getpid(), signal.SIGINT)  # once attached, straight to the daemon
        assert daemon.calls == ["reload", "stop", "stop"]
    finally:
        early.close()
    assert {sig: signal.getsignal(sig) for sig in EarlySignals.SIGNALS} == before
