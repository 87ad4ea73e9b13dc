"""The services beside the tick share one shape: they start in order, stop in reverse, each within a
timeout; one that cannot start or stop is a warning and the others go on. And the daemon stops every one of
them before its final restore, so nothing serves or writes while the hardware is put back."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from aithermd.actuate.journal import Journal
from aithermd.runtime.daemon import Daemon
from aithermd.runtime.services import ServiceGroup, Unavailable
from tests.support.fake_backend import FakeBackend
from tests.support.stub_engine import STUB_ENGINE


class Recorder:
    """A service that notes its start and stop in ``log``; ``start_does`` / ``stop_does``: "hang" (never
    returns), "raise" (RuntimeError), "unavailable" (:class:`Unavailable`), or None (returns at once)."""

    def __init__(self, name: str, log: list[str], start_does: str | None = None,
                 stop_does: str | None = None) -> None:
        self.name, self.log, self.start_does, self.stop_does = name, log, start_does, stop_does

    async def _do(self, what: str | None) -> None:
        if what == "hang":
            await asyncio.Event().wait()
        if what == "raise":
            raise RuntimeError(f"{self.name} broke")
        if what == "unavailable":
            raise Unavailable("thing_unavailable", reason="not on this machine")

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        await self._do(self.start_does)

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        await self._do(self.stop_does)


async def test_services_start_in_order_and_stop_in_reverse():
    log: list[str] = []
    group = ServiceGroup()
    await group.start([Recorder(n, log) for n in ("watchdog", "energy", "dbus", "fastlane")])
    assert [s.name for s in group.started] == ["watchdog", "energy", "dbus", "fastlane"]
    assert group.get("dbus").name == "dbus" and group.get("metrics") is None
    await group.stop()
    assert log == ["start watchdog", "start energy", "start dbus", "start fastlane",
                   "stop fastlane", "stop dbus", "stop energy", "stop watchdog"]
    assert group.started == []


async def test_a_service_that_cannot_start_is_a_warning_and_is_never_stopped():
    log: list[str] = []
    group = ServiceGroup(start_timeout_s=0.05)
    services = [Recorder("a", log), Recorder("hangs", log, start_does="hang"),
                Recorder("breaks", log, start_does="raise"),
                Recorder("absent", log, start_does="unavailable"), Recorder("b", log)]
    with capture_logs() as logs:
        await group.start(services)
    assert [s.name for s in group.started] == ["a", "b"]  # the start that hung was given up on
    warnings = {e["event"]: e for e in logs if e["log_level"] == "warning"}
    assert set(warnings) == {"hangs_unavailable", "breaks_unavailable", "thing_unavailable"}
    assert warnings["hangs_unavailable"]["error"].startswith("TimeoutError")
    assert warnings["breaks_unavailable"]["error"] == "RuntimeError: breaks broke"
    assert warnings["thing_unavailable"]["reason"] == "not on this machine"
    log.clear()
    await group.stop()
    assert log == ["stop b", "stop a"]


async def test_a_stop_that_hangs_or_fails_is_a_warning_and_the_others_still_stop():
    log: list[str] = []
    group = ServiceGroup(stop_timeout_s=0.05)
    await group.start([Recorder("first", log), Recorder("breaks", log, stop_does="raise"),
                       Recorder("hangs", log, stop_does="hang"), Recorder("last", log)])
    log.clear()
    with capture_logs() as logs:
        await group.stop()  # never raises
    assert log == ["stop last", "stop hangs", "stop breaks", "stop first"]
    failed = {e["service"]: e["error"] for e in logs if e["event"] == "service_stop_failed"}
    assert set(failed) == {"hangs", "breaks"}
    assert failed["hangs"].startswith("TimeoutError") and failed["breaks"] == "RuntimeError: breaks broke"
    assert group.started == []


async def test_the_daemon_stops_its_services_in_reverse_before_the_final_restore(settings, clock,
                                                                                 monkeypatch):
    """The daemon's own services and a recorder among them: started after the daemon's in order, stopped
    first, while the fans the tick took are still taken (journaled, not yet restored)."""
    log: list[str] = []
    backend = FakeBackend(start_pwm=100, start_enable=2)
    journal_at_stop: dict[str, bool] = {}

    class Witness(Recorder):
        async def stop(self) -> None:
            await super().stop()
            journal_at_stop[self.name] = Journal(settings.state_dir).dirty
            journal_at_stop[self.name + " pwm"] = backend.pwm["pwm1"] != 100

    services = Daemon._services

    def with_witnesses(self, options, executor):
        return [Witness("early", log), *services(self, options, executor), Witness("late", log)]

    monkeypatch.setattr(Daemon, "_services", with_witnesses)
    s = settings.replace(**{"metrics_listen": "127.0.0.1:0"})
    d = Daemon(s, clock=clock, backends=[backend], sleep=clock.sleep, engine=STUB_ENGINE)
    started: list[str] = []

    def note_started() -> bool:
        started[:] = [svc.name for svc in d.services.started]
        return True

    assert await d.run(max_ticks=3, until=note_started) == 0
    assert started == ["early", "watchdog", "energy", "metrics", "late"]
    assert log == ["start early", "start late", "stop late", "stop early"]
    # both stopped while the knobs were still the daemon's: the restore came after every service
    assert journal_at_stop == {"late": True, "late pwm": True, "early": True, "early pwm": True}
    assert (backend.pwm["pwm1"], backend.enable["pwm1"]) == (100, 2)
    assert not Journal(settings.state_dir).dirty
