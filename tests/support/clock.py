"""The tests' one clock: :class:`aithermd.clock.FakeClock` (moved only by ``advance``) plus the ``sleep``
the daemon is handed, which moves it. A test that waits on it never waits on the wall clock."""

from __future__ import annotations

import asyncio

from aithermd.clock import FakeClock


class SimClock(FakeClock):
    """Monotonic time from 1000 s, wall time from 2026-01-01 00:00 UTC unless told (see :class:`FakeClock`);
    ``await clock.sleep(s)`` advances both by ``s`` and yields to the loop once."""

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
