"""The daemon's own exit restore past a knob whose restore never returns (attack10 W3): a chip whose driver
stops answering as the daemon stops. The stop goes on with a deadline: every other device's fans are put
back, the hung knob's original stays journaled for ``aithermd restore``, and the exit code says so; once the
call returns, the restore left behind finishes its knob."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from aithermd.actuate import restore_devices
from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import restore_journal
from aithermd.runtime.daemon import Daemon
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


class StuckChip(FakeBackend):
    """A fake chip whose restore of ``pwm1`` blocks inside the backend call until ``gate`` opens."""

    def __init__(self, name: str) -> None:
        super().__init__(name, start_pwm=100, start_enable=2)
        self.gate = threading.Event()

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        if knob_id == self.kid("pwm1"):
            self.gate.wait(20)  # the test fails rather than hangs on a restore that waits for it
        super().restore_knob(knob_id, saved)


@pytest.fixture
def stuck(monkeypatch):
    monkeypatch.setattr(restore_devices, "RESTORE_DEADLINE_S", 0.3)
    chip = StuckChip("stuck")
    yield chip
    chip.gate.set()
    for thread in threading.enumerate():
        if thread.name == restore_devices.THREAD_NAME:
            thread.join(30)


async def test_the_daemons_stop_restores_every_other_device_past_a_hung_knob(settings, clock, stuck):
    other = FakeBackend("other", start_pwm=100, start_enable=2)
    d = Daemon(settings, clock=clock, backends=[other, stuck], sleep=clock.sleep, engine=STUB_ENGINE)
    assert await d.run(max_ticks=3) == 1  # the stop says a knob is not back
    assert other.pwm == {"pwm1": 100, "pwm2": 100} and other.enable == {"pwm1": 2, "pwm2": 2}
    assert stuck.pwm["pwm2"] == 100 and stuck.enable["pwm2"] == 2, "its chip's other fan too"
    assert set(Journal(settings.state_dir).entries()) == {stuck.kid("pwm1")}
    assert d.not_restored[stuck.kid("pwm1")].startswith("hung:")
    stuck.gate.set()
    for thread in threading.enumerate():
        if thread.name == restore_devices.THREAD_NAME:
            thread.join(30)
    assert stuck.pwm["pwm1"] == 100 and stuck.enable["pwm1"] == 2, "finished once the call returned"


def test_a_hung_knob_holds_up_no_other_device_and_its_entry_stays(tmp_path, stuck):
    other = FakeBackend("other", start_pwm=100, start_enable=2)
    journal = Journal(tmp_path)
    for backend in (other, stuck):  # the stuck chip's knobs newest: tried first
        for name in ("pwm1", "pwm2"):
            kid = backend.kid(name)
            journal.record(kid, backend.device_id, backend.locator(), backend.save_knob(kid), 0.0)
            backend.write_knob(kid, 20.0)
    report = restore_journal(journal, backends=[other, stuck])
    assert set(report.restored) == {other.kid("pwm1"), other.kid("pwm2"), stuck.kid("pwm2")}
    assert list(report.failed) == [stuck.kid("pwm1")] and report.failed[stuck.kid("pwm1")].startswith("hung:")
    assert set(journal.entries()) == {stuck.kid("pwm1")}
    assert set(Journal(tmp_path).entries()) == {stuck.kid("pwm1")}
