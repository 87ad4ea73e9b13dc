"""Tick lateness while D-Bus clients flood the service (target: no tick later than one 0.25 s period).

Run: ``.venv/bin/python benchmarks/bench_dbus_load.py [--rounds N]``. A private dbus-daemon (a system-bus
policy, its own socket) serves ``io.github.aithermd.Daemon1`` (:func:`aithermd.publish.dbus_service.start`)
from a hub holding the reference workstation with 16 GPUs (a ~24 kB ``GetSnapshot`` document; 640 of them
overflow any socket buffer). An asyncio ticker beside it publishes a fresh snapshot every 0.25 s (a quarter
of the daemon's default tick) and records how late each tick woke up. Two phases of the same length, in
the same process: *quiet* (no client: the reference) and *loaded* (another process with 10 connections, each
keeping 64 ``GetSnapshot`` calls in flight, ``N`` rounds). Printed: ticks, median and worst lateness of each
phase, the calls answered and the errors. Exit status 1 when a call failed or a loaded tick was later than
one period.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK_S = 0.25
CLIENTS, IN_FLIGHT = 10, 64
NAME, PATH = "io.github.aithermd.Daemon1", "/io/github/aithermd/Daemon1"
BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/>
    <allow send_type="method_call"/><allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/><allow receive_type="method_return"/>
    <allow receive_type="error"/><allow receive_type="signal"/>
  </policy>
</busconfig>
"""


async def clients(address: str, rounds: int) -> None:
    """The load (run in its own process): CLIENTS connections, each IN_FLIGHT calls at once, ``rounds``
    times. Prints one JSON line: {"ok": n, "errors": {name: n}, "seconds": s}."""
    from dbus_fast import Message, MessageType
    from dbus_fast.aio import MessageBus

    errors: dict[str, int] = {}

    async def one() -> int:
        bus = await MessageBus(bus_address=address).connect()
        ok = 0
        try:
            for _ in range(rounds):
                calls = [Message(destination=NAME, path=PATH, interface=NAME, member="GetSnapshot")
                         for _ in range(IN_FLIGHT)]
                replies = await asyncio.gather(*(bus.call(m) for m in calls))
                for reply in replies:
                    if reply.message_type is MessageType.ERROR:
                        errors[reply.error_name] = errors.get(reply.error_name, 0) + 1
                    else:
                        ok += 1
        finally:
            bus.disconnect()
        return ok

    t0 = time.monotonic()
    oks = await asyncio.gather(*(one() for _ in range(CLIENTS)))
    print(json.dumps({"ok": sum(oks), "errors": errors, "seconds": round(time.monotonic() - t0, 3)}))


async def ticker(hub, stop: asyncio.Event, lateness: list[float]) -> None:
    from aithermd.publish.reference import reference_snapshot

    loop = asyncio.get_running_loop()
    deadline, seq = loop.time(), 1
    while not stop.is_set():
        deadline += TICK_S
        await asyncio.sleep(max(0.0, deadline - loop.time()))
        lateness.append(loop.time() - deadline)
        seq += 1
        hub.publish(reference_snapshot(seq, gpus=16, tick_s=TICK_S))


async def measure(address: str, rounds: int) -> tuple[list[float], list[float], dict]:
    from aithermd.publish import dbus_service
    from aithermd.publish.hub import StateHub
    from aithermd.publish.reference import reference_snapshot

    hub = StateHub()
    hub.publish(reference_snapshot(1, gpus=16))
    # GetSnapshot reads the hub only: no control (policies, holds) is asked for
    handle = await dbus_service.start(address, None, hub, snapshot_interval_s=0.0)  # type: ignore[arg-type]
    try:
        quiet: list[float] = []
        stop = asyncio.Event()
        task = asyncio.ensure_future(ticker(hub, stop, quiet))
        proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--clients", address,
                                                    "--rounds", str(rounds), stdout=subprocess.PIPE)
        t0 = time.monotonic()
        out, _ = await proc.communicate()
        loaded_s = time.monotonic() - t0
        stop.set()
        await task
        loaded, quiet = quiet, []
        stop = asyncio.Event()
        task = asyncio.ensure_future(ticker(hub, stop, quiet))
        await asyncio.sleep(loaded_s)
        stop.set()
        await task
        return quiet, loaded, json.loads(out)
    finally:
        await handle.stop()


def figures(name: str, lateness: list[float]) -> str:
    return (f"{name:<8} {len(lateness):>6}  {statistics.median(lateness) * 1000:>11.1f}  "
            f"{max(lateness) * 1000:>10.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of 640 calls in the loaded phase")
    parser.add_argument("--clients", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients:
        asyncio.run(clients(args.clients, args.rounds))
        return 0
    from aithermd import log
    log.setup("warning")
    if shutil.which("dbus-daemon") is None:
        print("dbus-daemon is not installed (scripts/system-packages.txt)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="aithermd-bench-bus-"))
    (tmp / "bus.conf").write_text(BUS_CONFIG.format(socket=tmp / "bus"))
    bus = subprocess.Popen(["dbus-daemon", f"--config-file={tmp / 'bus.conf'}", "--nofork", "--nopidfile"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if (tmp / "bus").exists():
                break
            time.sleep(0.01)
        quiet, loaded, result = asyncio.run(measure(f"unix:path={tmp / 'bus'}", args.rounds))
    finally:
        bus.terminate()
        bus.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    calls = CLIENTS * IN_FLIGHT * args.rounds
    print(f"{CLIENTS} clients × {IN_FLIGHT} calls in flight × {args.rounds} rounds: {result['ok']}/{calls} "
          f"answered in {result['seconds']} s, errors {result['errors'] or 'none'}")
    print(f"{'phase':<8} {'ticks':>6}  {'median ms':>11}  {'worst ms':>10}   "
          f"(lateness of a {TICK_S:g} s tick)")
    print(figures("quiet", quiet))
    print(figures("loaded", loaded))
    ok = result["ok"] == calls and not result["errors"] and max(loaded) < TICK_S
    print(f"target: every call answered, no loaded tick later than {TICK_S:g} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
