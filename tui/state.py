"""TuiState: everything the TUI knows, updated by the app from its workers' messages; screens render it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aithermctl.document import effective_policy
from aithermctl.history import History


@dataclass
class TuiState:
    bus: str = "system"
    doc: dict[str, Any] | None = None
    connected: bool | None = None  # None until the first answer
    detail: str = ""  # why not connected
    history: History = field(default_factory=History)
    events: deque[tuple[str, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=500))
    events_total: int = 0  # events ever received, so a screen knows which are new
    policies: list[dict[str, Any]] = field(default_factory=list)
    explained: dict[str, Any] = field(default_factory=dict)
    span_s: float = 300.0  # what the plots show
    energy_report: dict[str, Any] | None = None  # the last GetEnergyReport (processes screen)

    def add_event(self, kind: str, event: dict[str, Any]) -> None:
        self.events.append((kind, event))
        self.events_total += 1

    def policy_line(self) -> str:
        """``policy ai-training · held: quiet (cookie 17) · dry run``, for the status line."""
        policy = (self.doc or {}).get("policy") or {}
        active = str(policy.get("active") or "—")
        parts = [f"policy {active}"]
        holds = policy.get("holds") or ()
        if holds:
            in_force = effective_policy(policy)
            cookies = ", ".join(str(h.get("cookie")) for h in holds)
            parts.append(f"in force: {in_force} (held, cookie {cookies})")
        states = policy.get("states") or {}
        for name, scopes in states.items():
            if name == active and scopes:
                parts.append(" ".join(f"{k} {v}" for k, v in scopes.items()))
        if (self.doc or {}).get("dry_run"):
            parts.append("dry run")
        if (self.doc or {}).get("degraded"):
            parts.append(f"degraded {len(self.doc['degraded'])}")
        return " · ".join(parts)
