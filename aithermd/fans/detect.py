"""``fans detect``: which fan inputs (``fanN``) follow which pwm, by stepping one pwm at a time.

The method is pwmconfig's (lm-sensors), made safe by :class:`~aithermd.fans.lab.Lab`: every pwm under test
goes to full and the fans settle; then each pwm in turn drops to 0 % while the others stay at full, the
fans settle, and every tachometer is read; the pwm goes back to full and the fans settle again. A fan
input *follows* a pwm when it fell to under :data:`FOLLOW_RATIO` of its full speed, by at least
:data:`FOLLOW_MIN_RPM`, and came back (a CPU header whose fan never stops at 0 % still falls far enough). So:

- one pwm can drive several fan inputs (a CPU cooler's second fan on CPU_OPT, a splitter with tach);
- a fan input that turns but follows none is *free* (a pump on SATA power, a fan on a hub);
- a fan input that reads 0 throughout is *idle*: nothing connected to that header;
- a pwm that no fan input follows drives an *empty* header (or a fan whose tach wire is not connected);
- but a pwm whose driver refused manual mode (firmware kept control: the duty may not reach the fan) is
  *not controlled*, not an empty header, and is left out: the daemon pairs it by number;
- and when fans turn but none follows any pwm of a whole detection, the writes did not reach the fans
  (the BIOS or EC kept control, or every fan is on fixed power): :attr:`Detection.suspect` says so and
  nothing is stored, rather than calling every header empty (which would leave every fan unwatched).

Index pairing (``fanN`` with ``pwmN``), which lm-sensors and every other tool assume, is what the daemon
uses until a detection has run; the difference is printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from aithermd.fans.lab import Lab
from aithermd.fans.store import FanSetup
from aithermd.model import FanCalibration, KnobKind, Quantity

FOLLOW_RATIO = 0.7  # a follower falls below 70 % of its full speed when its pwm drops to 0 %
FOLLOW_MIN_RPM = 150.0  # and by at least this much (tach noise on a fan that does not follow is ~1 %)
TURNING_RPM = 50.0  # a fan input reading more than this at full duty is connected


@dataclass
class Detection:
    """What :func:`detect` found: ``followers`` pwm id → fan inputs; ``full`` RPM of every input with every
    pwm at full; ``idle`` and ``free`` inputs; ``index_pairs`` pwm id → the ``fanN`` index pairing would
    give it (for the comparison)."""

    followers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    full: dict[str, float] = field(default_factory=dict)
    idle: tuple[str, ...] = ()
    free: tuple[str, ...] = ()
    index_pairs: dict[str, str | None] = field(default_factory=dict)
    complete: bool = True
    refused: dict[str, str] = field(default_factory=dict)  # pwm id → why its driver refused manual mode
    suspect: str | None = None  # why this detection must not be stored (None: it may)

    def setup(self, wall: float, previous: FanSetup | None = None) -> FanSetup:
        """The :class:`FanSetup` to store: the new mapping, keeping a previous calibration of a pwm whose
        followers did not change."""
        pwms = {}
        for knob_id, tachs in self.followers.items():
            old = previous.pwms.get(knob_id) if previous is not None else None
            pwms[knob_id] = old if old is not None and old.tachs == tachs else FanCalibration(tachs=tachs)
        idle, free = self.idle, self.free
        if previous is not None:
            pwms = {**{k: v for k, v in previous.pwms.items() if k not in pwms}, **pwms}
            if not self.complete:
                idle, free = previous.idle, previous.free
        return FanSetup(MappingProxyType(pwms), idle, free, wall,
                        previous.calibrated_wall if previous is not None else None)


def writable_pwms(devices: Iterable) -> list[str]:
    """The writable hwmon pwm knob ids of ``devices``, in discovery order."""
    return [k.id for d in devices for k in d.knobs if k.kind is KnobKind.PWM and k.writable]


def fan_inputs(devices: Iterable) -> list[str]:
    """Every hwmon fan input channel id (``fanN``) of ``devices``."""
    return [c.id for d in devices for c in d.channels if c.quantity is Quantity.FAN]


def detect(lab: Lab, pwms: Sequence[str], tachs: Sequence[str], *, complete: bool = True) -> Detection:
    """Step each of ``pwms`` with the others at full and watch ``tachs`` (see the module doc). ``complete``
    False: ``pwms`` are some of the machine's only, so no input is called idle or free (an untested pwm may
    drive it). Raises LabAborted (the lab restores every pwm on the way out)."""
    out = Detection(index_pairs={p: _index_pair(lab, p) for p in pwms})
    lab.say(f"all {len(pwms)} pwm outputs to full; waiting for the fans to settle")
    for p in pwms:
        lab.set(p, 100.0)
    out.full = lab.settle(tachs, min_s=3.0)
    turning = [t for t in tachs if out.full[t] > TURNING_RPM]
    seen_turning: set[str] = set(turning)
    claimed: set[str] = set()
    for p in pwms:
        lab.say(f"{p}: 0 % for a few seconds (the others stay at full)")
        lab.set(p, 0.0)
        low = lab.settle(tachs, min_s=3.0)
        lab.set(p, 100.0)
        high = lab.settle(tachs, min_s=2.0)
        seen_turning.update(t for t in tachs if max(low[t], high[t]) > TURNING_RPM)
        follows = tuple(t for t in turning
                        if low[t] < FOLLOW_RATIO * high[t] and high[t] - low[t] >= FOLLOW_MIN_RPM)
        refused = _mode_refused(lab, p)
        if refused is not None and not follows:
            out.refused[p] = refused
            lab.say(f"{p}: not controlled: its driver refuses manual mode ({refused})")
            continue
        out.followers[p] = follows
        claimed.update(follows)
        lab.say(f"{p}: " + (", ".join(_short(t) for t in follows) if follows else "no fan input follows it"))
    if complete:
        out.idle = tuple(t for t in tachs if t not in seen_turning)
        out.free = tuple(t for t in tachs if t in seen_turning and t not in claimed)
    out.complete = complete
    if pwms and turning and not claimed:
        out.suspect = (f"{len(turning)} fan input(s) turn but none followed any of the {len(pwms)} pwm "
                       "output(s) tested: the writes do not reach the fans (the BIOS or EC keeps control: "
                       "set the fan headers to manual/PWM control in the firmware setup), or every fan is "
                       "on fixed power")
    return out


def _mode_refused(lab: Lab, pwm: str) -> str | None:
    fn = getattr(lab.backend, "pwm_knob", None)
    return fn(pwm).mode_refused if fn is not None else None


def _index_pair(lab: Lab, pwm: str) -> str | None:
    knob, _device = lab.knobs[pwm]
    return knob.fan_channel


def _short(channel_id: str) -> str:
    return channel_id.rsplit("/", 1)[-1]


def report(det: Detection) -> list[str]:
    """Lines for people: each pwm's fans, empty headers, idle and free inputs, and where index pairing
    (``fanN`` with ``pwmN``) was wrong."""
    lines = []
    for pwm, tachs in det.followers.items():
        if tachs:
            rpm = ", ".join(f"{_short(t)} ({det.full.get(t, 0):.0f} RPM at full)" for t in tachs)
            lines.append(f"{pwm} drives {rpm}")
        else:
            lines.append(f"{pwm} drives no fan input: an empty header (or a fan without its tach wire)")
        paired = det.index_pairs.get(pwm)
        if paired is not None and (paired not in tachs or len(tachs) > 1):
            lines.append(f"  (pairing by number would have said {_short(paired)})")
    for t in det.free:
        lines.append(f"{t} turns ({det.full.get(t, 0):.0f} RPM) but follows no pwm (a pump or fan on fixed "
                     "power)")
    for t in det.idle:
        lines.append(f"{t} reads 0 RPM throughout: nothing connected")
    for pwm, why in det.refused.items():
        lines.append(f"{pwm}: not controlled: its driver refuses manual mode ({why}); left paired by number")
    if det.suspect:
        lines.append(f"nothing stored: {det.suspect}")
    return lines
