"""A threaded backend (NVML) that found no device gets no worker hop each tick; one that did, does."""

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
