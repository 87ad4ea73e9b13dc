"""A stop that arrives during start-up (a signal, ``request_stop()``) ends the daemon as any stop does: no
service starts, no tick runs, what start-up wrote is restored, exit 0."""

from __future__ import annotations

import os
import signal

from aithermd.actuate.journal import Journal
from aithermd.runtime.daemon import Daemon
from aithermd.runtime.signals import Signals
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


def make(settings, clock, backend):
    return Daemon(settings, clock=clock, backends=[backend], sleep=clock.sleep, engine=STUB_ENGINE)


async def test_a_stop_while_the_crashed_run_is_restored_still_restores_and_exits_0(settings, clock):
    b = FakeBackend(start_pwm=40, start_enable=2)
    j = Journal(settings.state_dir)
    j.record(b.kid("pwm1"), b.device_id, b.locator(), {"pwm": 40, "enable": 2}, 0)
    b.pwm["pwm1"], b.enable["pwm1"] = 255, 1  # what the crashed run left
    d = make(settings, clock, b)
    real = b.restore_knob

    def restore_knob(knob_id, saved):
        d.request_stop()  # SIGTERM while start-up puts the crashed run's knob back
        real(knob_id, saved)

    b.restore_knob = restore_knob  # type: ignore[method-assign]
    assert await d.run() == 0
    assert d.hub.latest is None and b.writes == []  # no tick ran
    assert (b.pwm["pwm1"], b.enable["pwm1"]) == (40, 2)
    assert not Journal(settings.state_dir).dirty


async def test_a_stop_during_discovery_writes_nothing(settings, clock):
    b = FakeBackend(start_pwm=100, start_enable=2)
    d = make(settings, clock, b)
    real = b.discover

    def discover():
        d.request_stop()
        return real()

    b.discover = discover  # type: ignore[method-assign]
    assert await d.run() == 0
    assert d.hub.latest is None and b.writes == [] and b.pwm == {"pwm1": 100, "pwm2": 100}


async def test_a_signal_caught_before_the_loop_is_acted_on_when_the_daemon_starts(settings, clock):
    signals = Signals.catch()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while `aithermd run` is still importing
        assert signals.pending == [signal.SIGTERM]
        b = FakeBackend(start_pwm=100, start_enable=2)
        assert await make(settings, clock, b).run(handle_signals=signals) == 0
        assert b.writes == [] and signals.pending == []
    finally:
        signals.close()


async def test_signals_handled_in_process_are_given_back_after_the_run(settings, clock):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    d = make(settings, clock, FakeBackend())
    assert await d.run(max_ticks=1, handle_signals=True) == 0
    assert {sig: signal.getsignal(sig) for sig in before} == before
