"""``aithermctl run --progress-regex REGEX -- CMD``: a job's own progress rate, read from what it prints.

Training loops already print their progress: step counters (``step 1200/50000``, ``Epoch 3: 41%|...|
820/2000``), rates (tqdm's ``3.21it/s``, or ``1.52s/it`` when slow). The command's stdout and stderr pass
through unchanged; each line (tqdm redraws with ``\\r``: each redraw counts as a line) is matched against
REGEX:

- a named group ``rate`` is steps per second as printed (``(?P<rate>[\\d.]+)it/s``);
- a named group ``secs`` is seconds per step (``(?P<secs>[\\d.]+)s/it``);
- otherwise the first group (or a group ``step``) is a step counter: the rate is its rise over the last
  :data:`COUNTER_WINDOW_S` seconds (a counter that goes back, a new epoch, starts the window again).

As soon as there is a rate, then every :data:`REPORT_S` seconds, the latest rate goes to the daemon
(``ReportProgress``) for the GPUs the job runs on: ``--progress-gpus``, else the GPUs whose process lists
(the daemon's ``processes``) hold the command or one of its descendants, else those ``CUDA_VISIBLE_DEVICES``
names (UUIDs, or indexes, which are NVML's only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on identical
boards), else every GPU.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

REPORT_S = 5.0
POLL_S = 0.5
COUNTER_WINDOW_S = 20.0
QUIET_S = 30.0  # a job whose output has matched nothing for this long is not reported (hung, or done
#                 with the phase that printed): its last rate is no longer news (the daemon's own 30 s)
CHUNK = 65536


class RateMeter:
    """Turns matched lines into a rate (steps/s). ``clock``: monotonic seconds (injectable for tests)."""

    def __init__(self, pattern: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.regex = re.compile(pattern)
        self.clock = clock
        self.rate: float | None = None
        self.seen: float | None = None  # when a line last gave a rate or a step
        self._counts: deque[tuple[float, float]] = deque()

    def fresh(self) -> bool:
        """A rate is known and the output gave one within :data:`QUIET_S`."""
        return self.rate is not None and self.seen is not None and self.clock() - self.seen <= QUIET_S

    def feed(self, line: str) -> None:
        """Read one line (or redraw). What does not parse as a finite number ≥ 0 (``nan``, ``inf``,
        ``1e999``, ``-3``) is ignored, as a line that does not match."""
        m = self.regex.search(line)
        if m is None:
            return
        groups = m.groupdict()
        try:
            if groups.get("rate") is not None:
                rate = float(groups["rate"])
                if math.isfinite(rate) and rate >= 0:
                    self.rate, self.seen = rate, self.clock()
                return
            if groups.get("secs") is not None:
                secs = float(groups["secs"])
                if math.isfinite(secs) and secs > 0:
                    self.rate, self.seen = 1.0 / secs, self.clock()
                return
            text = groups.get("step")
            if text is None and m.groups():
                text = m.group(1)
            if text is None:
                return
            step = float(text)
        except (ValueError, IndexError):
            return
        if not math.isfinite(step):
            return
        now = self.clock()
        self.seen = now
        if self._counts and step < self._counts[-1][1]:
            self._counts.clear()  # a counter that went back: a new epoch
        self._counts.append((now, step))
        while len(self._counts) > 2 and now - self._counts[1][0] >= COUNTER_WINDOW_S:
            self._counts.popleft()
        (t0, s0), (t1, s1) = self._counts[0], self._counts[-1]
        if t1 - t0 >= 1.0:
            self.rate = (s1 - s0) / (t1 - t0)


async def pump(reader: asyncio.StreamReader, out: Any, meter: RateMeter) -> None:
    """Copy ``reader`` to ``out`` (a binary stream) as it comes, feeding each line or redraw to ``meter``."""
    pending = b""
    while True:
        chunk = await reader.read(CHUNK)
        if not chunk:
            break
        out.write(chunk)
        out.flush()
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        for line in lines:
            meter.feed(line.decode("utf-8", "replace"))
        if len(pending) > CHUNK:
            pending = pending[-CHUNK:]
    if pending:
        meter.feed(pending.decode("utf-8", "replace"))


def gpus_from_env(env: Mapping[str, str], devices: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The GPU ids ``CUDA_VISIBLE_DEVICES`` names (indexes or UUIDs), or None when it is unset or names
    none of ``devices`` (the snapshot's devices)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return None
    gpus = [d for d in devices if d.get("kind") == "gpu"]
    out = []
    for item in (v.strip() for v in visible.split(",")):
        for d in gpus:
            info = d.get("info") or {}
            if item == str(info.get("index")) or (item.startswith("GPU-") and item == info.get("uuid")):
                out.append(str(d["id"]))
    return out or None


def gpus_of_user(processes_doc: Mapping[str, Any], user: str | None = None) -> list[str]:
    """The GPUs whose compute processes (the ``GetProcesses`` document, kind ``C``) are all ``user``'s
    (default: this process's): the ones aithermd takes a progress report for from a user who is not root."""
    if user is None:
        import pwd

        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = str(os.geteuid())
    out = []
    for gpu, entry in (processes_doc.get("gpus") or {}).items():
        users = {p.get("user") for p in entry.get("processes") or () if "C" in str(p.get("kinds") or "")}
        if users == {user}:
            out.append(str(gpu))
    return out


def gpus_of_tree(pid: int, processes_doc: Mapping[str, Any]) -> list[str]:
    """The GPUs whose process lists (the ``GetProcesses`` document) hold ``pid`` or a descendant of it."""
    try:
        import psutil

        tree = {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - the job may have ended; psutil may be absent
        tree = {pid}
    out = []
    for gpu, entry in (processes_doc.get("gpus") or {}).items():
        if any(int(p.get("pid", -1)) in tree for p in entry.get("processes") or ()):
            out.append(str(gpu))
    return out


async def follow(proc: asyncio.subprocess.Process, meter: RateMeter,
                 report: Callable[[list[str], float], Awaitable[None]],
                 resolve: Callable[[int], Awaitable[list[str]]], note: Callable[[str], None],
                 every_s: float = REPORT_S, out: Any = None, err: Any = None) -> int:
    """Copy ``proc``'s piped output on (to ``out``/``err``, default ours) through ``meter``; while it runs,
    ``report(gpus, rate)`` as soon as a rate is known and then every ``every_s`` s while the output keeps
    giving one (:meth:`RateMeter.fresh`: a job gone quiet is not reported, so its reading lapses in the
    daemon), ``resolve(pid)`` naming the GPUs each time (a job's processes reach its GPUs as it goes).
    A daemon that refuses is said once and the job goes on. Returns the raw exit status (``wait()``)."""
    assert proc.stdout is not None and proc.stderr is not None
    pumps = asyncio.gather(pump(proc.stdout, out or sys.stdout.buffer, meter),
                           pump(proc.stderr, err or sys.stderr.buffer, meter))
    waiter = asyncio.ensure_future(proc.wait())
    warned = False
    last: float | None = None
    while not waiter.done():
        await asyncio.wait({waiter}, timeout=POLL_S)
        now = meter.clock()
        if waiter.done() or not meter.fresh() or (last is not None and now - last < every_s):
            continue
        last = now
        try:
            gpus = await resolve(proc.pid)
            if not gpus:  # the job not seen on a GPU yet (aithermd lists processes every few seconds)
                continue
            await report(gpus, meter.rate)
        except Exception as exc:  # noqa: BLE001 - the job goes on whatever the daemon says
            if not warned:
                note(f"progress not reported: {exc} (trying again while the job runs)")
                warned = True
            continue
        if warned:
            note(f"progress reported from now on ({', '.join(gpus)})")
            warned = False
    await pumps
    return waiter.result()
