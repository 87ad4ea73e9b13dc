"""Messages that carry data from the app's workers to its screens (workers fetch, widgets render)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class SnapshotArrived(Message):
    doc: dict[str, Any]


@dataclass
class HistoryArrived(Message):
    history: dict[str, Any]


@dataclass
class EventArrived(Message):
    kind: str
    event: dict[str, Any]


@dataclass
class ConnectionChanged(Message):
    connected: bool
    detail: str = ""


@dataclass
class PolicyInfoArrived(Message):
    policies: list[dict[str, Any]]
    explained: dict[str, Any]


@dataclass
class RequestDone(Message):
    """A change the user asked for finished: ``error`` is the one-line failure, or None."""

    request: dict[str, Any]
    error: str | None = None
    origin: Any = field(default=None, repr=False)


@dataclass
class EnergyReportArrived(Message):
    report: dict[str, Any]
