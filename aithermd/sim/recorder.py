"""What a simulated daemon published, kept for the run's summary (a hub listener): every actuation with
the rule and reason that decided it (and ``took``, the value read back after it, when the card did not take
the value asked: a power limit the driver refused under a floor), every knob handed back as found when no
rule decided it any more (a clock lock released when work returns: a ``restore`` event, listed with ``rule``
None), the time each policy state lasted, and the GPUs the daemon found held high while idle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aithermd.model import Event, Snapshot


@dataclass
class Recorder:
    """What the daemon published, kept for the summary: actuations, policy states over time."""

    actuations: list[dict[str, Any]] = field(default_factory=list)
    held_idle: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU → first found, W, recovered
    state_s: dict[str, dict[str, float]] = field(default_factory=dict)  # "policy/device" → state → s
    _last: tuple[float, dict[str, str]] | None = None
    t0: float = 0.0
    _found: dict[str, Any] = field(default_factory=dict)  # knob → the value before the daemon's first write
    _now: dict[str, Any] = field(default_factory=dict)  # knob → the value the daemon wrote last

    def _handed_back(self, snapshot: Snapshot, ev: Event) -> dict[str, Any]:
        """A knob no rule decides any more, put back as found (a clock lock released when work returns)."""
        device = ev.subject.split("/", 1)[0]
        states = ", ".join(f"{policy}: {device} {devs[device]}"
                           for policy, devs in snapshot.policy.states.items() if device in devs)
        why = f"no rule decides it now{f' ({states})' if states else ''}: handed back as found"
        return {"t_s": round(snapshot.t_mono - self.t0, 1), "knob": ev.subject,
                "old": self._now.pop(ev.subject), "new": self._found.get(ev.subject),
                "unit": ev.data.get("unit"), "rule": None,
                "reason": why + (f" ({ev.message.split(': ', 1)[1]})" if ": " in ev.message else "")}

    def __call__(self, snapshot: Snapshot, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.kind == "actuation":
                dec = snapshot.decisions.get(ev.subject)
                self.actuations.append({"t_s": round(snapshot.t_mono - self.t0, 1), "knob": ev.subject,
                                        **{k: ev.data.get(k) for k in ("old", "new", "unit", "rule")},
                                        "reason": dec.reason if dec is not None else None})
                self._found.setdefault(ev.subject, ev.data.get("old"))
                self._now[ev.subject] = ev.data.get("new")
            elif ev.kind == "drift" and ev.data.get("why") == "did_not_stick" and self.actuations \
                    and self.actuations[-1]["knob"] == ev.subject and self.actuations[-1].get("rule"):
                self.actuations[-1]["took"] = ev.data.get("got")  # read back after the write: what it took
            elif ev.kind == "restore" and ev.subject in self._now:  # handed back: no rule decides it now
                self.actuations.append(self._handed_back(snapshot, ev))
        for gpu, attrs in snapshot.attrs.items():
            h = attrs.get("held_idle")
            if h:
                first = round(snapshot.t_mono - self.t0 - h["for_s"], 1)
                seen = self.held_idle.setdefault(gpu, {"first_s": first, "held_w": h["held_w"], "held_s": 0.0,
                                                       "floor_w": h["floor_w"], "recovered_w": 0.0})
                seen["recovered_w"] = max(seen["recovered_w"], h["recovered_w"])
                seen["held_s"] = round(seen["held_s"] + snapshot.tick_s, 1)
        flat = {f"{policy}/{dev}": state for policy, devs in snapshot.policy.states.items()
                for dev, state in devs.items()}
        if self._last is not None:
            dt = snapshot.t_mono - self._last[0]
            for key, state in self._last[1].items():
                per = self.state_s.setdefault(key, {})
                per[state] = per.get(state, 0.0) + dt
        self._last = (snapshot.t_mono, flat)
