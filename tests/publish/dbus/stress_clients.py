"""Many clients, many calls in flight: run by test_dbus_backpressure.py in its own process.

    stress_clients.py ADDRESS CLIENTS IN_FLIGHT ROUNDS

Each of CLIENTS connections sends IN_FLIGHT GetSnapshot calls at once, waits for all, ROUNDS times. Prints
one JSON line: {"ok": n, "errors": {name: n}, "min_len": bytes, "seconds": s}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

NAME = "io.github.aithermd.Daemon1"


async def one_client(address: str, in_flight: int, rounds: int, errors: Counter, sizes: list[int]) -> int:
    bus = await MessageBus(bus_address=address).connect()
    ok = 0
    try:
        for _ in range(rounds):
            replies = await asyncio.gather(*(bus.call(Message(
                destination=NAME, path="/io/github/aithermd/Daemon1", interface=NAME, member="GetSnapshot"))
                for _ in range(in_flight)))
            for reply in replies:
                if reply.message_type is MessageType.ERROR:
                    errors[reply.error_name] += 1
                elif json.loads(reply.body[0])["devices"]:
                    ok += 1
                    sizes.append(len(reply.body[0]))
    finally:
        bus.disconnect()
    return ok


async def main(address: str, clients: int, in_flight: int, rounds: int) -> None:
    errors: Counter = Counter()
    sizes: list[int] = []
    t0 = time.monotonic()
    oks = await asyncio.gather(*(one_client(address, in_flight, rounds, errors, sizes)
                                 for _ in range(clients)))
    print(json.dumps({"ok": sum(oks), "errors": dict(errors), "min_len": min(sizes, default=0),
                      "seconds": round(time.monotonic() - t0, 3)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
