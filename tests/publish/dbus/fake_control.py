"""A DaemonControl that records what it was asked and validates like the real one."""

from __future__ import annotations

from typing import Any

from aithermd import errors
from aithermd.publish.reference import reference_devices

POLICIES = {"balanced": "Relax when idle.", "quiet": "Quiet desk.", "ai-training": "Raise limits when busy."}


class FakeControl:
    def __init__(self) -> None:
        self.active = "balanced"
        self.holds: dict[int, dict[str, Any]] = {}
        self.overrides: dict[str, tuple[float, float]] = {}
        self.calls: list[tuple] = []
        self.reloads = 0
        self.reload_error: errors.PolicyErrors | None = None
        self._next_cookie = 1
        self.knobs = {k.id: k for d in reference_devices() for k in d.knobs}

    def _policy(self, name: str) -> None:
        if name not in POLICIES:
            raise errors.UnknownPolicy(f"no policy {name!r}")

    def list_policies(self) -> list[dict[str, Any]]:
        return [{"name": n, "path": f"/etc/aithermd/policies/{n}.yaml", "description": d,
                 "active": n == self.active} for n, d in sorted(POLICIES.items())]

    def get_policy(self, name: str) -> dict[str, Any]:
        self._policy(name)
        return {"name": name, "path": f"/etc/aithermd/policies/{name}.yaml", "description": POLICIES[name],
                "source": f"name: {name}\n"}

    def set_active_policy(self, name: str) -> None:
        self._policy(name)
        self.calls.append(("set_active_policy", name))
        self.active = name

    def hold_policy(self, policy: str, reason: str, timeout_s: float, owner: str, uid: int | None,
                    detached: bool, *, root: bool = False) -> int:
        self._policy(policy)
        cookie = self._next_cookie
        self._next_cookie += 1
        self.holds[cookie] = {"policy": policy, "reason": reason, "timeout_s": timeout_s, "owner": owner,
                              "uid": uid, "detached": detached}
        self.calls.append(("hold_policy", cookie))
        return cookie

    def hold_uid(self, cookie: int) -> int | None:
        return self.holds[cookie]["uid"] if cookie in self.holds else None

    def release_policy(self, cookie: int, by: int | None = None) -> None:
        if cookie not in self.holds:
            raise errors.UnknownCookie(f"no hold {cookie}")
        del self.holds[cookie]
        self.calls.append(("release_policy", cookie))
        self.released_by = by

    def release_owner(self, owner: str) -> None:
        self.calls.append(("release_owner", owner))
        for cookie in [c for c, h in self.holds.items() if h["owner"] == owner and not h["detached"]]:
            del self.holds[cookie]

    def set_override(self, knob_id: str, value: float, seconds: float) -> float:
        from aithermd.runtime.control import clamp_request

        if knob_id not in self.knobs:
            raise errors.UnknownKnob(knob_id)
        applied = clamp_request(self.knobs[knob_id], value)
        self.overrides[knob_id] = (applied, seconds)
        self.calls.append(("set_override", knob_id, value, seconds))
        return applied

    def override_warnings(self, knob_id: str, value: float, seconds: float) -> list[str]:
        from aithermd.runtime.control import override_warnings

        return override_warnings(self.knobs[knob_id], value, seconds)

    def clear_override(self, knob_id: str) -> None:
        if knob_id not in self.knobs:
            raise errors.UnknownKnob(knob_id)
        self.overrides.pop(knob_id, None)
        self.calls.append(("clear_override", knob_id))

    async def release_gpu(self, device_id: str) -> str:
        if not device_id.startswith("gpu"):
            raise errors.UnknownKnob(f"no GPU {device_id!r}")
        self.calls.append(("release_gpu", device_id))
        return f"{device_id} released"

    def report_progress(self, gpus: list[str], rate: float) -> None:
        known = {k.device_id for k in self.knobs.values() if k.id.endswith("/power_limit")}
        if set(gpus) - known:
            raise errors.InvalidArgument(f"no GPU {', '.join(sorted(set(gpus) - known))} here")
        self.calls.append(("report_progress", list(gpus), rate))

    def reload(self) -> None:
        if self.reload_error is not None:
            raise self.reload_error
        self.reloads += 1
        self.calls.append(("reload",))

    def explain(self, knob_id: str) -> dict[str, Any]:
        if knob_id and knob_id not in self.knobs:
            raise errors.UnknownKnob(knob_id)
        ids = [knob_id] if knob_id else sorted(self.knobs)
        return {k: {"value": 50.0, "requested": 50.0, "layer": "policy", "rule": f"{self.active}/x",
                    "reason": "test", "inputs": {}} for k in ids}
