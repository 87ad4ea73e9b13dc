"""attack8 T5: a running daemon follows `timedatectl set-timezone` for policies with `timezone: local`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tzdata

from aithermd.runtime import localzone
from aithermd.runtime.localzone import CHECK_S, LocalZone

ZONES = Path(tzdata.__file__).parent / "zoneinfo"


@pytest.fixture
def zone_link(tmp_path):
    link = tmp_path / "localtime"
    link.symlink_to(ZONES / "UTC")
    return link


def repoint(link: Path, zone: str) -> None:
    """What systemd-timedated does: a new symlink renamed over the old one."""
    tmp = link.with_name("localtime.new")
    tmp.symlink_to(ZONES / zone)
    os.replace(tmp, link)


def test_the_zone_file_is_looked_at_once_a_minute_and_read_again_only_when_it_changed(zone_link):
    calls = []
    zone = LocalZone(str(zone_link), tzset=lambda: calls.append(1))
    assert zone.check(0.0) is False and calls == []  # as found at start
    repoint(zone_link, "America/Los_Angeles")
    assert zone.check(CHECK_S - 1) is False and calls == []  # not due yet: no look
    assert zone.check(CHECK_S) is True and calls == [1]
    assert zone.check(2 * CHECK_S) is False and calls == [1]  # unchanged since
    zone_link.unlink()  # gone (a half-done change): read again, the C library falls back to UTC
    assert zone.check(3 * CHECK_S) is True and calls == [1, 1]


def test_tz_in_the_environment_pins_the_zone_and_nothing_is_looked_at(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    assert localzone.zone_path() is None
    zone = LocalZone(tzset=lambda: pytest.fail("no tzset while TZ pins the zone"))
    assert zone.check(0.0) is False and zone.check(1e9) is False
    monkeypatch.delenv("TZ")
    assert localzone.zone_path() == "/etc/localtime"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private /etc/localtime (CI runs as root)")
def test_the_tick_follows_a_new_etc_localtime_in_a_running_process(tmp_path):
    """A private mount namespace whose /etc/localtime is a file rewritten as timedatectl would; the tick's
    own LocalZone (runtime/tick.py) reads it again and a Calendar in local time moves 8 h."""
    zone = tmp_path / "localtime"
    shutil.copy(ZONES / "UTC", zone)
    script = textwrap.dedent(f"""
        import os, shutil, time
        os.environ.pop("TZ", None); time.tzset()
        from aithermd.policy.schedules import Calendar
        from aithermd.runtime.tick import LocalZone
        t = 1_765_000_000.0  # 2025-12-06 05:46:40 UTC, 21:46 the day before in Los Angeles
        z = LocalZone()
        before = Calendar("local").local(t)[1]
        shutil.copy({str(ZONES / "America/Los_Angeles")!r}, "/etc/localtime")
        later = time.time() + 5  # glibc tells a new zone file by its inode and mtime in whole seconds
        os.utime("/etc/localtime", (later, later))
        stale = Calendar("local").local(t)[1]
        z.check({CHECK_S})
        print(before, stale, Calendar("local").local(t)[1])
    """)
    p = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind "{zone}" /etc/localtime && exec '
                        f'"{sys.executable}" -c "$0"', script], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "TZ"})
    if p.returncode != 0 and "mount" in p.stderr and "permission" in p.stderr.lower():
        pytest.skip(f"no private mount namespace here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(5 * 60 + 46), str(5 * 60 + 46), str(21 * 60 + 46)]


async def test_each_tick_asks_its_local_zone_once_due(tmp_path, zone_link):
    from aithermd.clock import FakeClock
    from tests.watchers.conftest import POLICIES, make_tick, settings_for

    policies = tmp_path / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / f"{name}.yaml").write_text(text)
    clock = FakeClock()
    tick = make_tick(settings_for(tmp_path, tmp_path, policies), [], clock)
    calls = []
    tick.zone = LocalZone(str(zone_link), tzset=lambda: calls.append(clock.monotonic()))
    start = clock.monotonic()
    try:
        await tick.run(1)
        repoint(zone_link, "America/Los_Angeles")
        for seq in range(2, 80):
            clock.advance(1.0)
            await tick.run(seq)
        assert calls == [start + CHECK_S]  # read again at the first look due, once
    finally:
        tick.executor.worker.shutdown()
