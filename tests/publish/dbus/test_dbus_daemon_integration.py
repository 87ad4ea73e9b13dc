"""`aithermd run --simulate` on our private bus and a loopback metrics port: both interfaces against the
simulated workstation, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request

import pytest
from dbus_fast import MessageType
from dbus_helpers import NOBODY, call, free_port, ok, run_client_async

from aithermd.publish import wire

pytestmark = pytest.mark.slow


async def _until(predicate, timeout_s: float = 30.0):
    for _ in range(int(timeout_s / 0.1)):
        result = await predicate()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def _property(client, name: str):
    reply = await call(client, "Get", "ss", [wire.INTERFACE, name],
                       interface="org.freedesktop.DBus.Properties")
    return reply.body[0].value if reply.message_type is MessageType.METHOD_RETURN else None


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


async def test_the_simulated_workstation_over_dbus_and_prometheus(bus_address, polkitd, client, tmp_path):
    port = free_port()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "aithermd", "run", "--simulate", "--bus", bus_address, "--metrics-listen",
         f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), "--tick", "0.2", "--duration", "60",
         "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=(tmp_path / "daemon.log").open("wb"),
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        async def snapshot():
            reply = await call(client, "GetSnapshot")
            if reply.message_type is MessageType.METHOD_RETURN:
                doc = json.loads(reply.body[0])
                return doc if doc["seq"] >= 2 else None
            return None

        doc = await _until(snapshot)
        kinds = {d["kind"] for d in doc["devices"]}
        assert {"gpu", "hwmon"} <= kinds
        assert doc["policy"]["active"] == "balanced"
        pwm = next(k for d in doc["devices"] for k in d["knobs"] if k["kind"] == "pwm" and k["writable"])

        # anyone reads; an unprivileged caller is refused and nothing changes
        lines = await run_client_async(bus_address, [["ListPolicies", "", []],
                                                      ["SetActivePolicy", "s", ["quiet"]]])
        assert lines[0]["uid"] == NOBODY
        assert lines[1]["error"] is None and lines[2]["error"] == wire.ERROR_NOT_AUTHORIZED
        assert await _property(client, "ActivePolicy") == "balanced"

        # root: named errors for bad arguments, then a real change
        bad = await call(client, "SetOverride", "sdd", [pwm["id"], 250.0, 0.0])
        assert bad.error_name == wire.ERROR_OUT_OF_RANGE
        (wid,) = await ok(client, "StartEnergyWindow", "sd", ["epoch", 0.0])
        await ok(client, "SetActivePolicy", "s", ["quiet"])
        await _until(lambda: _is(client, "ActivePolicy", "quiet"))
        await asyncio.sleep(1.0)
        (text,) = await ok(client, "StopEnergyWindow", "t", [wid])
        window = json.loads(text)
        gpu_joules = [j for device, j in window["joules"].items() if device.startswith("gpu")]
        assert gpu_joules and all(j > 0 for j in gpu_joules), window

        exposition = await asyncio.to_thread(_metrics, port)
        assert 'aithermd_policy_active{policy="quiet"} 1.0' in exposition
        assert "aithermd_gpu_power_watts{" in exposition
        assert "aithermd_tick_duration_seconds_count" in exposition
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    assert daemon.returncode == 0, (tmp_path / "daemon.log").read_text()[-3000:]


async def _is(client, name: str, expected) -> bool:
    return await _property(client, name) == expected

