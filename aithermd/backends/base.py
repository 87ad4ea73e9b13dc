"""The contract every hardware backend keeps. Nothing outside ``aithermd/backends`` touches hardware."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from aithermd.errors import UnknownKnob
from aithermd.model import Device, KnobValue, Sample

# A fan's manual original below this duty is not put back at restore: it goes to the driver's automatic mode
# (the product's rule "never in manual mode at a low duty"; half duty is the line: a board or GPU fan at half
# speed cools its part at moderate load, below it not reliably). What the daemon finds when a fan's true
# original was lost (a journal moved aside, a driver reload, another controller's crash: attack6 G1, G5, G9).
LOW_DUTY_PCT = 50.0
# Key set in a saved state handed back to another program that keeps writing the knob (the applier's
# step-back): that program drives the fan, so its manual mode is put back at any duty.
TO_WRITER = "to_writer"


@runtime_checkable
class Backend(Protocol):
    """One hardware family (hwmon, powercap, cpu, nvml) under one root.

    - ``discover()`` finds devices once (and again on hotplug); ids are stable across boots.
    - ``sample()`` reads every discovered channel and knob once, through kept-open descriptors where it can;
      a failing file gives its reading a status, never an exception.
    - ``write_knob(knob_id, value)`` sets a knob in daemon units (duty %, W), switching the knob to manual
      mode first where it has modes; raises :class:`~aithermd.errors.BackendError` subclasses.
    - ``read_knob(knob_id)`` reads one knob back.
    - ``save_knob(knob_id)`` returns the knob's original raw state as a JSON-able dict (value and mode, in
      the hardware's units); ``restore_knob(knob_id, saved)`` puts exactly that back, or leaves the knob safe
      instead (a fan at full duty) and returns a note saying so (None: the original is back). A fan found
      in manual mode below :data:`LOW_DUTY_PCT` is handed to its driver's automatic mode instead (nothing
      would drive it once the daemon is gone), unless ``saved`` holds :data:`TO_WRITER` (it is handed back
      to the program that keeps writing it).
    - ``locator()`` is a JSON-able dict naming the backend and its root (``{"backend": "hwmon",
      "sysfs_root": "/sys"}``), enough for :func:`aithermd.backends.registry.open_backend` to rebuild it in
      another process (``aithermd restore``).
    """

    kind: str

    def discover(self) -> list[Device]: ...

    def sample(self) -> Sample: ...

    def write_knob(self, knob_id: str, value: float) -> None: ...

    def read_knob(self, knob_id: str) -> KnobValue: ...

    def save_knob(self, knob_id: str) -> dict[str, Any]: ...

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> str | None: ...

    def locator(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ReadOnly:
    """Mixin for backends with channels only (cpu, the slow-sensor lane): every knob call raises
    :class:`~aithermd.errors.UnknownKnob`."""

    def read_knob(self, knob_id: str) -> KnobValue:
        raise UnknownKnob(knob_id)

    def write_knob(self, knob_id: str, value: float) -> None:
        raise UnknownKnob(knob_id)

    def save_knob(self, knob_id: str) -> dict[str, Any]:
        raise UnknownKnob(knob_id)

    def restore_knob(self, knob_id: str, saved: dict[str, Any]) -> None:
        raise UnknownKnob(knob_id)
