"""A safe session for fan detection and calibration: journal first, restore after, a time limit, and an abort
on any temperature rising past a margin.

pwmconfig stops each fan for a few seconds and asks the user to check by ear that they came back; fan2go's
initialisation sweeps each fan while the daemon starts. Both can leave a fan stopped when interrupted. Here
every pwm is journaled (:class:`~aithermd.actuate.journal.Journal`, the daemon's own, in the state
directory) before its first write, so whatever ends the session — its end, an abort, an exception,
Ctrl-C, SIGTERM, or SIGKILL followed by ``aithermd restore`` (the unit's ``ExecStopPost=``) or the next
daemon start — puts every pwm back as found.

:class:`Lab` is synchronous: it waits through the injected ``sleep`` (``time.sleep``, or the simulated
workstation's, which moves its physics) and reads through the backend's ``sample()``. Between waits it
checks the time limit, the temperatures and a stop request (:meth:`Lab.stop`, from a signal handler), and
raises :class:`LabAborted` when one says stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aithermd.actuate.journal import Journal
from aithermd.actuate.restore import RestoreReport, restore_journal
from aithermd.clock import Clock
from aithermd.errors import AithermError
from aithermd.model import Quantity, Status

POLL_S = 0.5  # how often a wait reads the tachometers and temperatures
STABLE_RPM = 30.0  # a settled fan moves less than this, or than STABLE_RATIO of its speed, within a second
STABLE_RATIO = 0.03


class LabAborted(AithermError):
    """The session stopped early (time limit, a temperature past its margin, a stop request)."""


@dataclass(frozen=True)
class LabOptions:
    """``time_limit_s``: the whole session; ``margin_c``: abort when a temperature rose this far above its
    reading at the start (or came within ``crit_margin_c`` of its ``crit``); ``settle_s``: the longest wait
    for the fans to settle after a change."""

    time_limit_s: float = 900.0
    margin_c: float = 10.0
    crit_margin_c: float = 5.0
    settle_s: float = 12.0


class Lab:
    """One session over ``backend`` (an opened hwmon backend), the ``devices`` its discovery found, and
    ``journal``. Use as a context manager: leaving it restores every pwm written (the report is
    :attr:`restored`)."""

    def __init__(self, backend: Any, devices: Iterable[Any], journal: Journal, *, clock: Clock,
                 sleep: Callable[[float], None], options: LabOptions | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.backend, self.journal, self.clock, self._sleep = backend, journal, clock, sleep
        self.options = options or LabOptions()
        self.say = say or (lambda _text: None)
        self.devices = {d.id: d for d in devices}
        self.knobs = {k.id: (k, d.id) for d in self.devices.values() for k in d.knobs}
        self._temps = {c.id: c for d in self.devices.values() for c in d.channels
                       if c.quantity is Quantity.TEMPERATURE}
        self.baseline: dict[str, float] = {}
        self._t0 = 0.0
        self._stop: str | None = None
        self.restored: RestoreReport | None = None

    # -- session ---------------------------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self._t0 = self.clock.monotonic()
        self.baseline = {cid: r.value for cid, r in self._read().items()
                         if cid in self._temps and r.status is Status.OK and r.value is not None}
        return self

    def __exit__(self, *exc: object) -> None:
        self.restored = restore_journal(self.journal, backends=[self.backend])
        for knob_id, why in self.restored.failed.items():
            self.say(f"error: {knob_id} could not be restored: {why} (it stays journaled: aithermd restore)")
        for note in self.restored.fallbacks.values():
            self.say(f"warning: {note}")

    def stop(self, why: str) -> None:
        """Ask the session to stop at its next wait (safe from a signal handler)."""
        self._stop = why

    # -- actions ---------------------------------------------------------------------------------------------
    def set(self, knob_id: str, duty_pct: float) -> None:
        """Journal ``knob_id`` (once), then write ``duty_pct`` % (manual mode)."""
        knob, device_id = self.knobs[knob_id]
        if knob_id not in self.journal:
            self.journal.record(knob_id, device_id, self.backend.locator(), self.backend.save_knob(knob_id),
                                self.clock.wall())
        self.backend.write_knob(knob_id, duty_pct)

    def raw(self, knob_id: str) -> int | None:
        """The ``pwmN`` value (0–255) read back now, None when unreadable."""
        kv = self.backend.read_knob(knob_id)
        return None if kv.value is None else round(kv.value * 255 / 100)

    def rpm(self, tachs: Iterable[str]) -> dict[str, float]:
        """Each tach's RPM now (0 for one that fails to read)."""
        readings = self._read()
        out = {}
        for t in tachs:
            r = readings.get(t)
            ok = r is not None and r.status is Status.OK and r.value is not None
            out[t] = float(r.value) if ok else 0.0  # type: ignore[union-attr, arg-type]
        return out

    def wait(self, seconds: float) -> None:
        """Wait ``seconds``, checking limits every :data:`POLL_S`. Raises LabAborted."""
        end = self.clock.monotonic() + seconds
        while (left := end - self.clock.monotonic()) > 1e-9:
            self._sleep(min(POLL_S, left))
            self.check()

    def settle(self, tachs: Iterable[str], *, min_s: float = 1.0,
               max_s: float | None = None) -> dict[str, float]:
        """Wait until every tach in ``tachs`` holds its speed for a second (at least ``min_s``, at most
        ``max_s``, default the options' ``settle_s``); returns their RPM then."""
        tachs = tuple(tachs)
        limit = self.options.settle_s if max_s is None else max_s
        start = self.clock.monotonic()
        history: list[dict[str, float]] = []
        while True:
            self.wait(POLL_S)
            history.append(self.rpm(tachs))
            waited = self.clock.monotonic() - start
            steps = max(1, round(1.0 / POLL_S))
            if waited >= min_s and len(history) > steps and _stable(history[-1 - steps], history[-1]):
                return history[-1]
            if waited >= limit:
                return history[-1]

    def check(self) -> None:
        """Raise LabAborted for a stop request, the time limit, or a temperature past its margin."""
        if self._stop is not None:
            raise LabAborted(f"stopped: {self._stop}")
        elapsed = self.clock.monotonic() - self._t0
        if elapsed > self.options.time_limit_s:
            raise LabAborted(f"time limit of {self.options.time_limit_s:g} s reached")
        for cid, r in self._read().items():
            if cid not in self._temps or r.status is not Status.OK or r.value is None:
                continue
            value = float(r.value)
            crit = self._temps[cid].thresholds.get("crit")
            if crit is not None and value >= crit - self.options.crit_margin_c:
                raise LabAborted(f"{cid} at {value:g} °C, within {self.options.crit_margin_c:g} °C of its "
                                 f"critical {crit:g} °C")
            base = self.baseline.get(cid)
            if base is not None and value > base + self.options.margin_c:
                raise LabAborted(f"{cid} rose to {value:g} °C, more than {self.options.margin_c:g} °C above "
                                 f"the {base:g} °C it read at the start")

    def _read(self) -> Mapping[str, Any]:
        return self.backend.sample().readings


def _stable(before: Mapping[str, float], now: Mapping[str, float]) -> bool:
    return all(abs(now[t] - before[t]) <= max(STABLE_RPM, STABLE_RATIO * max(now[t], before[t])) for t in now)
