"""The documented meaning of hwmon channels whose driver gives no label, or an older one.

Policies name CPU temperatures by label (``Tctl``, ``Package id *``), but labels came late to some drivers:

- **k10temp** (Documentation/hwmon/k10temp.rst, drivers/hwmon/k10temp.c): ``temp1_input`` is always Tctl,
  the temperature the platform controls its fans by; on Zen CPUs that report it, ``temp2_input`` is Tdie;
  ``temp3_input`` onwards are the core complex dies Tccd1, Tccd2, ... Labels are only exported since
  Linux 5.6 and only on Zen, so older kernels, and pre-Zen families on any kernel, show ``temp1`` alone.
- **coretemp** (Documentation/hwmon/coretemp.rst, drivers/hwmon/coretemp.c): ``temp1`` is the package of
  the platform device ``coretemp.N`` (package N), ``temp2`` onwards the cores (``BASE_SYSFS_ATTR_NO`` 2).
  Kernels before 3.15 labelled the package ``Physical id N``, newer ones ``Package id N``.

:func:`alias` gives such a channel the name the current driver would show; selectors match it as they
match a label, while ``label`` stays what lm-sensors prints (None when the driver gives none).
"""

from __future__ import annotations

import re

_PHYSICAL = re.compile(r"Physical id (\d+)$")
_PLATFORM_ID = re.compile(r"\.(\d+)$")


def alias(driver: str, attribute: str, label: str | None, device_name: str | None) -> str | None:
    """The current documented name of channel ``attribute`` (``temp1``) of a ``driver`` chip whose own
    label is ``label``; ``device_name`` is the chip's parent device directory (``coretemp.1``). None when
    the label already is that name, or nothing is known."""
    if not attribute.startswith("temp"):
        return None
    n = int(attribute[4:]) if attribute[4:].isdigit() else 0
    if driver == "k10temp" and label is None and n >= 1:
        return "Tctl" if n == 1 else "Tdie" if n == 2 else f"Tccd{n - 2}"
    if driver == "coretemp":
        if label is not None:
            m = _PHYSICAL.match(label)
            return f"Package id {m[1]}" if m else None
        if n == 1:
            m = _PLATFORM_ID.search(device_name or "")
            return f"Package id {m[1] if m else 0}"
        if n >= 2:
            return f"Core {n - 2}"
    return None
