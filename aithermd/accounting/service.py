"""The energy side of the daemon, fed by published snapshots: one meter, the energy windows, and (when
the daemon gives it backends) the accountant that says which process used the joules.

:meth:`EnergyService.on_publish` is a :class:`~aithermd.publish.hub.StateHub` listener (cheap: one pass
over the snapshot's energy channels); the process accounting runs at its own cadence, off the event loop.
State (open windows, the meter's counter points, idle floors) is kept in ``<state_dir>/energy.json``, written
at most every ``save_every_s`` and on stop, so windows and their sums survive a daemon restart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from aithermd.accounting.meter import EnergyMeter, points_from_json, points_to_json
from aithermd.accounting.windows import EnergyWindows
from aithermd.clock import Clock, RealClock
from aithermd.files import read_regular
from aithermd.model import Event, Snapshot

STATE_FILE = "energy.json"
FORMAT = "aithermd-energy/1"
MAX_STATE_BYTES = 4 << 20


class EnergyService:
    """``state_dir`` None: nothing is kept across restarts (tests, ``--dry-run``)."""

    def __init__(self, clock: Clock | None = None, state_dir: Path | None = None, *, per_uid: int = 8,
                 max_windows: int = 256, save_every_s: float = 60.0) -> None:
        self.clock = clock or RealClock()
        self.state_path = None if state_dir is None else Path(state_dir) / STATE_FILE
        self.save_every_s = save_every_s
        self._log = structlog.get_logger("aithermd.energy")
        saved = self._load()
        self.meter = EnergyMeter(seed=points_from_json(saved.get("points")))
        self.windows = EnergyWindows(self.clock, per_uid=per_uid, max_windows=max_windows)
        restored = self.windows.restore(saved.get("windows") or [])
        if restored:
            self._log.info("energy_windows_restored", windows=restored)
        self.saved_state = saved
        self._last_save: float | None = None

    def _load(self) -> dict[str, Any]:
        if self.state_path is None:
            return {}
        try:
            data = json.loads(read_regular(self.state_path, MAX_STATE_BYTES)[:MAX_STATE_BYTES + 1])
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._log.warning("energy_state_unreadable", path=str(self.state_path), error=str(exc),
                              message="energy windows start empty")
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            self._log.warning("energy_state_unreadable", path=str(self.state_path), error="unknown format")
            return {}
        return data

    def on_publish(self, snapshot: Snapshot, events: Sequence[Event] = ()) -> None:
        increment = self.meter.feed(snapshot)
        self.windows.add(increment)
        now = self.clock.monotonic()
        if self.windows.changed or self._last_save is None or now - self._last_save >= self.save_every_s:
            self.save()

    def state(self) -> dict[str, Any]:
        return {"format": FORMAT, "points": points_to_json(self.meter.points()),
                "windows": self.windows.to_json()}

    def save(self) -> None:
        """Write the state file now (atomically); a failure is logged, never raised."""
        self._last_save = self.clock.monotonic()
        self.windows.changed = False
        if self.state_path is None:
            return
        tmp = self.state_path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(self.state(), separators=(",", ":")))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except OSError as exc:
            self._log.warning("energy_state_not_saved", path=str(self.state_path), error=str(exc))

    def stop(self) -> None:
        self.save()
