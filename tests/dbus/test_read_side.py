"""Anyone may read: properties, GetSnapshot, GetHistory, Explain, ListPolicies, GetPolicy, signals."""

from __future__ import annotations

import json

from dbus_fast import MessageType

from aithermd.publish import wire
from conftest import call, ok


async def test_get_snapshot_is_the_sensors_document_with_decisions_and_policy(service, client):
    (text,) = await ok(client, "GetSnapshot")
    doc = json.loads(text)
    assert doc["seq"] == 1
    gpu0 = next(d for d in doc["devices"] if d["id"] == "gpu0")
    assert gpu0["kind"] == "gpu"
    limit = next(k for k in gpu0["knobs"] if k["id"] == "gpu0/power_limit")
    assert limit["value"] == 450.0 and limit["min"] == 150.0 and limit["max"] == 600.0
    assert limit["requested"] == 450.0 and limit["reason"] == "power_limit follows balanced"
    temp = next(c for c in gpu0["channels"] if c["attribute"] == "temperature")
    assert temp["unit"] == "°C" and temp["status"] == "ok" and isinstance(temp["value"], float)
    assert doc["policy"] == {"active": "balanced", "holds": [], "states": {"balanced": {"gpu0": "idle"}}}
