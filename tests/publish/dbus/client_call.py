"""Run by the tests as another process (often as uid 65534 through setpriv): make calls, print JSON.

    client_call.py ADDRESS '[["Member", "signature", [args...]], ...]' [--linger] [--concurrent]

Prints one JSON line per call: {"member", "error": name or null, "body": [...]} and, with --linger, waits
for a line on stdin before disconnecting (so the test controls when the caller leaves the bus). With
--concurrent, every call is sent at once (a flood), the replies printed in the calls' order.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

BUS_NAME = "io.github.aithermd.Daemon1"


async def main(address: str, calls: list, linger: bool, concurrent: bool = False) -> None:
    bus = await MessageBus(bus_address=address).connect()
    print(json.dumps({"unique_name": bus.unique_name, "uid": os.getuid()}), flush=True)

    async def one(member: str, signature: str, body: list) -> dict:
        reply = await bus.call(Message(destination=BUS_NAME, path="/io/github/aithermd/Daemon1",
                                       interface=BUS_NAME, member=member, signature=signature, body=body))
        error = reply.error_name if reply.message_type is MessageType.ERROR else None
        return {"member": member, "error": error, "body": reply.body}

    if concurrent:
        for line in await asyncio.gather(*(one(*c) for c in calls)):
            print(json.dumps(line), flush=True)
    for member, signature, body in [] if concurrent else calls:
        print(json.dumps(await one(member, signature, body)), flush=True)
    if linger:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    bus.disconnect()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), "--linger" in sys.argv[3:],
                     "--concurrent" in sys.argv[3:]))
