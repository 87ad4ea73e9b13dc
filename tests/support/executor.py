"""What :class:`aithermd.actuate.execute.Executor` is handed, reduced to what it reads: a world of knobs and
their owners, a worker that runs a job at once (or is late), and hwmon-style fan knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aithermd.model import Knob, KnobKind


@dataclass
class KnobWorld:
    """``knobs`` id → Knob, ``owner`` id → backend, ``inline`` the backends written on the loop's side."""

    knobs: dict
    owner: dict
    inline: tuple
    devices: tuple = field(default_factory=tuple)


class InstantWorker:
    """The loop's worker as the executor sees it: runs the job at once, or is ``late`` (None)."""

    def __init__(self, late: bool = False) -> None:
        self.late, self.busy = late, False

    async def hop(self, fn: Any, *args: Any, budget_s: float | None = None, submitted: Any = None) -> Any:
        return None if self.late else fn(*args)


def pwm_fan(knob_id: str) -> Knob:
    """A writable pwm knob of 0–100 % on the device named before the ``/`` of ``knob_id``."""
    return Knob(knob_id, knob_id.split("/")[0], KnobKind.PWM, "%", 0.0, 100.0, None, True)
