"""A backend that found no device is not sampled each tick (a threaded one, NVML, gets no worker hop); one
that did, is."""

from __future__ import annotations

from types import MappingProxyType

from aithermd.backends.registry import Inventory


class Kind:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def test_only_threaded_backends_with_devices_are_sampled_off_the_loop():
    hwmon, nvml = Kind("hwmon"), Kind("nvml")
    empty = Inventory(backends=(hwmon, nvml), device_owner=MappingProxyType({"hwmon:x": hwmon}))
    assert empty.inline == (hwmon,) and empty.threaded == ()
    found = Inventory(backends=(hwmon, nvml), device_owner=MappingProxyType({"hwmon:x": hwmon, "gpu0": nvml}))
    assert found.inline == (hwmon,) and found.threaded == (nvml,)


def test_inline_backends_without_devices_are_not_sampled():
    hwmon, thermal, powercap = Kind("hwmon"), Kind("thermal"), Kind("powercap")
    inv = Inventory(backends=(hwmon, thermal, powercap),
                    device_owner=MappingProxyType({"hwmon:x": hwmon, "powercap:package-0": powercap}))
    assert inv.inline == (hwmon, powercap) and inv.threaded == ()
    assert Inventory(backends=(hwmon, thermal)).inline == ()
