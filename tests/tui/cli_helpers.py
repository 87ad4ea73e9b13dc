"""Run aithermctl as a process (as people do) while the test's event loop keeps serving the bus."""

from __future__ import annotations

import asyncio
import sys


async def ctl(bus: str, *args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aithermctl", "--bus", bus, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def start(bus: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aithermctl", "--bus", bus, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def finish(proc: asyncio.subprocess.Process, timeout: float = 20.0) -> int:
    """Wait for ``proc`` and drain its pipes (so no transport outlives the test's event loop)."""
    await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode
