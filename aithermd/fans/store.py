"""What fan detection and calibration found, kept in the state directory (``fans.json``), and applied to the
devices discovery found, with the admin's names (config ``names``).

``fans.json`` (written atomically, like the journal)::

    {"version": 1, "detected_wall": s, "calibrated_wall": s | null,
     "pwms": {KNOB_ID: {"tachs": [CHANNEL_ID...], "start_pct": % | null, "stop_pct": % | null,
                        "rpm": {CHANNEL_ID: [[duty %, RPM], ...]}, "levels": [raw...], "calibrated": bool}},
     "idle": [CHANNEL_ID...],   # fan inputs that read 0 throughout: nothing connected
     "free": [CHANNEL_ID...]}   # fan inputs that turn but follow no pwm (a pump on SATA power)

:func:`apply` returns the devices with each pwm knob's :class:`~aithermd.model.FanCalibration`
(``Knob.fan``; ``fan_channel`` becomes the first detected tach) and every admin name: a knob's ``label``; a
channel's ``label`` (its own label, as lm-sensors shows it, moves to ``alias``, so policies that name it
still match). A pwm's name also names its detected fan channels that have none (``"CPU fan"``,
``"CPU fan (2)"``). Ids never change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from aithermd.actuate.journal import write_atomically
from aithermd.model import Channel, Device, FanCalibration, Knob, KnobKind

if TYPE_CHECKING:
    from aithermd.backends.registry import Inventory

FANS_FILE = "fans.json"
VERSION = 1


class FanStoreError(ValueError):
    """``fans.json`` cannot be read (not JSON, wrong shape)."""


@dataclass(frozen=True)
class FanSetup:
    """Detection and calibration results: ``pwms`` knob id → calibration, ``idle`` and ``free`` fan inputs."""

    pwms: Mapping[str, FanCalibration] = field(default_factory=dict)
    idle: tuple[str, ...] = ()
    free: tuple[str, ...] = ()
    detected_wall: float | None = None
    calibrated_wall: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "detected_wall": self.detected_wall,
                "calibrated_wall": self.calibrated_wall,
                "pwms": {k: {"tachs": list(c.tachs), "start_pct": c.start_pct, "stop_pct": c.stop_pct,
                             "rpm": {t: [list(p) for p in pts] for t, pts in c.rpm.items()},
                             "levels": list(c.levels), "calibrated": c.calibrated}
                         for k, c in self.pwms.items()},
                "idle": list(self.idle), "free": list(self.free)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FanSetup:
        pwms = {}
        for knob_id, c in dict(doc.get("pwms", {})).items():
            rpm = {str(t): tuple((float(d), float(r)) for d, r in pts)
                   for t, pts in dict(c.get("rpm", {})).items()}
            pwms[str(knob_id)] = FanCalibration(
                tachs=tuple(map(str, c.get("tachs", ()))), start_pct=_num(c.get("start_pct")),
                stop_pct=_num(c.get("stop_pct")), rpm=MappingProxyType(rpm),
                levels=tuple(int(v) for v in c.get("levels", ())), calibrated=bool(c.get("calibrated")))
        return cls(MappingProxyType(pwms), tuple(map(str, doc.get("idle", ()))),
                   tuple(map(str, doc.get("free", ()))), _num(doc.get("detected_wall")),
                   _num(doc.get("calibrated_wall")))


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def load(state_dir: Path) -> FanSetup | None:
    """The state directory's ``fans.json``, or None when there is none. Raises FanStoreError."""
    path = Path(state_dir) / FANS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FanStoreError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return FanSetup.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise FanStoreError(f"{path}: not a fan calibration ({exc}); run 'aithermd fans detect' "
                            "again") from exc


def save(state_dir: Path, setup: FanSetup) -> Path:
    """Write ``fans.json`` atomically; returns its path. Raises OSError."""
    path = Path(state_dir) / FANS_FILE
    write_atomically(path, json.dumps(setup.to_json(), indent=1, sort_keys=True).encode(), mode=0o644)
    return path


def expected_rpm(cal: FanCalibration, tach: str, duty_pct: float) -> float | None:
    """The RPM ``tach`` turned at ``duty_pct`` when calibrated: linear between points, None below the first
    point or without a curve."""
    points = cal.rpm.get(tach)
    if not points or duty_pct < points[0][0]:
        return None
    for (d0, r0), (d1, r1) in zip(points, points[1:], strict=False):
        if duty_pct <= d1:
            return r0 + (r1 - r0) * (duty_pct - d0) / (d1 - d0) if d1 > d0 else r1
    return points[-1][1]


def apply(devices: Sequence[Device], setup: FanSetup | None, names: Mapping[str, str]) -> tuple[Device, ...]:
    """``devices`` with ``setup``'s calibrations and the admin's ``names`` (id → name) applied (see the
    module doc); the same tuple when there is nothing to apply."""
    if setup is None and not names:
        return tuple(devices)
    pwms = setup.pwms if setup is not None else {}
    derived: dict[str, str] = {}
    for dev in devices:
        for k in dev.knobs:
            name = names.get(k.id)
            cal = pwms.get(k.id)
            tachs = cal.tachs if cal is not None else ((k.fan_channel,) if k.fan_channel else ())
            for i, tach in enumerate(tachs):
                if name and tach not in names:
                    derived.setdefault(tach, name if i == 0 else f"{name} ({i + 1})")
    out = []
    for dev in devices:
        channels = tuple(_channel(c, names.get(c.id) or derived.get(c.id)) for c in dev.channels)
        knobs = tuple(_knob(k, names.get(k.id), pwms.get(k.id)) for k in dev.knobs)
        same = (channels, knobs) == (dev.channels, dev.knobs)
        out.append(dev if same else replace(dev, channels=channels, knobs=knobs))
    return tuple(out)


def _channel(c: Channel, name: str | None) -> Channel:
    if not name or name == c.label:
        return c
    alias = getattr(c, "alias", None)
    fields: dict[str, Any] = {"label": name}
    if hasattr(c, "alias"):
        fields["alias"] = c.label if c.label is not None else alias
    return replace(c, **fields)


def _knob(k: Knob, name: str | None, cal: FanCalibration | None) -> Knob:
    if k.kind is not KnobKind.PWM:
        cal = None
    if name is None and cal is None:
        return k
    if (name is None or k.label == name) and (cal is None or k.fan == cal):
        return k  # applied already (a world rebuilt from a decorated inventory)
    fields: dict[str, Any] = {}
    if name:
        fields["label"] = name
    if cal is not None:
        fields["fan"] = cal
        fields["fan_channel"] = cal.tachs[0] if cal.tachs else None
    return replace(k, **fields)


@dataclass(frozen=True)
class FanConfig:
    """What the daemon applies to every discovery: the stored ``setup`` (None: nothing detected) and the
    admin's ``names`` (id → name)."""

    setup: FanSetup | None = None
    names: Mapping[str, str] = field(default_factory=dict)

    def decorate(self, inventory: Inventory) -> Inventory:
        """``inventory`` with :func:`apply` done to its devices (the same object when nothing changes)."""
        devices = apply(inventory.devices, self.setup, self.names)
        if all(a is b for a, b in zip(devices, inventory.devices, strict=True)):
            return inventory
        knobs = {k.id: k for d in devices for k in d.knobs}
        return replace(inventory, devices=devices, knobs=MappingProxyType(knobs))


def fan_config(state_dir: Path, names: Mapping[str, str]) -> FanConfig:
    """The daemon's :class:`FanConfig`: ``fans.json`` of ``state_dir`` and the config's ``names``. A broken
    ``fans.json`` is logged and left out: the fans are then paired by number, uncalibrated."""
    log = structlog.get_logger("aithermd.fans")
    try:
        setup = load(state_dir)
    except FanStoreError as exc:
        log.error("fans_unreadable", error=str(exc))
        setup = None
    if setup is None:
        log.info("fans_uncalibrated", message="fan inputs are paired with pwm outputs by number; "
                 "'aithermctl fans detect' finds which follows which, 'fans calibrate' their start and stop")
    return FanConfig(setup, dict(names))
