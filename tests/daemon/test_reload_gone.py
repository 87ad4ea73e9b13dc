"""A reload that would leave the daemon without any policy to run is refused: the old policies stay."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from aithermd.daemon import Daemon
from aithermd.errors import PolicyErrors

from .fakes import FakeBackend
from .stub_engine import STUB_ENGINE


async def test_removing_the_active_and_configured_policy_is_refused(settings, clock, policy_dir):
    b = FakeBackend()
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)
    balanced = policy_dir / "balanced.yaml"
    seen = []

    def step():
        seq = d.hub.latest.seq
        seen.append((seq, d.hub.latest.policy.active, d.hub.latest.decisions[b.kid("pwm1")].value))
        if seq == 1:
            assert settings.policy == "balanced" and d.operator.active == "balanced"
            balanced.unlink()  # the admin removes the one policy that is active and configured
            d.request_reload()
        return False

    with capture_logs() as logs:
        assert await d.run(max_ticks=3, until=step) == 0
    assert seen == [(1, "balanced", 60.0), (2, "balanced", 60.0), (3, "balanced", 60.0)]
    assert sorted(d.world.policies) == ["balanced", "handsoff", "quiet"]
    failed = [e for e in logs if e["event"] == "reload_failed"]
    assert [e["error"] for e in failed] == [
        f"{balanced}: error: policy balanced would be gone: the daemon would have no policy to run "
        "(hint: put the file back, or first make another policy active (aithermctl policy set NAME))"]
    assert not any(e["event"] == "fault" and "not loaded" in e.get("message", "") for e in logs)


async def test_dbus_reload_without_the_active_policy_raises(settings, clock, policy_dir):
    b = FakeBackend()
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)
    raised = []

    def step():
        if d.hub.latest.seq == 1:
            (policy_dir / "balanced.yaml").unlink()
            with pytest.raises(PolicyErrors) as info:
                d.operator.reload()
            raised.append(str(info.value))
        return False

    await d.run(max_ticks=2, until=step)
    assert raised and "policy balanced would be gone" in raised[0]
    assert d.hub.latest.policy.active == "balanced"


async def test_removing_the_active_policy_still_falls_back_to_the_configured_one(settings, clock, policy_dir):
    b = FakeBackend()
    d = Daemon(settings, clock=clock, backends=[b], sleep=clock.sleep, engine=STUB_ENGINE)

    def step():
        seq = d.hub.latest.seq
        if seq == 1:
            d.operator.set_active_policy("quiet")
        if seq == 2:
            (policy_dir / "quiet.yaml").unlink()
            d.request_reload()
        return False

    await d.run(max_ticks=3, until=step)
    assert d.hub.latest.policy.active == "balanced" and sorted(d.world.policies) == ["balanced", "handsoff"]
