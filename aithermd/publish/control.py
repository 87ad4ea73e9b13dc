"""What the D-Bus service may ask of the daemon: the operator's side of the control loop.

The daemon implements :class:`DaemonControl`; the D-Bus layer checks authorization *before* calling a
mutating method, and maps the exceptions below to D-Bus errors (``aithermd.publish.wire``). Mutations take
effect between ticks; every method but :meth:`DaemonControl.reload` is called on the event loop thread
and returns quickly.
"""

from __future__ import annotations

from typing import Any, Protocol


class DaemonControl(Protocol):
    def list_policies(self) -> list[dict[str, Any]]:
        """[{"name", "path", "description", "active": bool}], sorted by name."""

    def get_policy(self, name: str) -> dict[str, Any]:
        """{"name", "path", "description", "source": YAML text}. Raises UnknownPolicy."""

    def set_active_policy(self, name: str) -> None:
        """Make ``name`` the active policy (kept across restarts). Raises UnknownPolicy."""

    def hold_policy(self, policy: str, reason: str, timeout_s: float, owner: str, uid: int | None,
                    detached: bool, *, root: bool = False) -> int:
        """Put ``policy`` on top until released, timed out (``timeout_s`` > 0) or, unless ``detached``,
        until ``owner`` (a D-Bus unique name) leaves the bus. Returns the cookie (uint32, never 0).
        Raises UnknownPolicy, InvalidArgument, LimitExceeded (too many holds in all, or for ``uid``
        unless ``root``)."""

    def hold_uid(self, cookie: int) -> int | None:
        """The uid that took hold ``cookie`` (None: no such hold, or taken without a uid)."""

    def release_policy(self, cookie: int, by: int | None = None) -> None:
        """End a hold; ``by``: the caller's uid, named in the event. Raises UnknownCookie."""

    def release_owner(self, owner: str) -> None:
        """``owner`` left the bus: end its non-detached holds."""

    def set_override(self, knob_id: str, value: float, seconds: float) -> float:
        """Operator override of one knob (daemon units), for ``seconds`` (0 = until cleared); persists across
        restarts. Returns the value applied (a value just outside the knob's constraints is clamped to it).
        Raises UnknownKnob, OutOfRange (far outside the knob's constraints), InvalidArgument (read-only)."""

    def override_warnings(self, knob_id: str, value: float, seconds: float) -> list[str]:
        """What to warn the caller of an override about (a fan stopped until cleared), as sentences."""

    def clear_override(self, knob_id: str) -> None:
        """Raises UnknownKnob when no such knob exists."""

    def report_progress(self, gpus: list[str], rate: float) -> None:
        """A job's own progress rate (steps per second) on ``gpus`` (device ids), for 30 s: the
        efficient-limit search's best signal. Raises InvalidArgument (no or unknown GPU, a bad rate)."""

    def reload(self) -> None:
        """Reload policies all-or-nothing; they take effect at the next tick. Blocking (reads and parses
        every policy file): called off the event loop, in a thread of its own. Raises PolicyErrors (nothing
        changed)."""

    async def release_gpu(self, device_id: str) -> str:
        """Restore GPU ``device_id``'s originals and stop using it until it is back; returns what was done.
        Raises UnknownKnob (no such GPU), InvalidArgument."""

    def explain(self, knob_id: str) -> dict[str, Any]:
        """{knob_id: {"value", "requested", "layer", "rule", "reason", "inputs"}} for one knob or, with "",
        all knobs. Raises UnknownKnob."""
