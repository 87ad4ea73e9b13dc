"""Stable device ids: natural ordering by bus path and ``#2``/``#3`` suffixes for repeated ids.

A backend orders its devices by where they sit on the bus (``devices/pci0000:00/0000:00:18.3``,
``intel-rapl:1:0``), never by the boot-dependent ``hwmonN`` number, then calls :func:`unique_ids` so that
the second device with the same base id is ``<id>#2``, the third ``<id>#3`` (model.py: id rules).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``hwmon2`` before ``hwmon10`` and ``intel-rapl:2`` before ``intel-rapl:10``."""
    return tuple((1, int(part)) if part.isdigit() else (0, part) for part in _DIGITS.split(text) if part)


def unique_ids(base_ids: Iterable[str]) -> list[str]:
    """``base_ids`` in the same order, the n-th repeat of an id suffixed ``#n`` (n ≥ 2)."""
    seen: dict[str, int] = {}
    out: list[str] = []
    taken = set()
    for base in base_ids:
        n = seen.get(base, 0) + 1
        seen[base] = n
        candidate = base if n == 1 else f"{base}#{n}"
        while candidate in taken:  # a literal "x#2" already present: keep counting
            n += 1
            seen[base] = n
            candidate = f"{base}#{n}"
        taken.add(candidate)
        out.append(candidate)
    return out


ADDRESSED_BUSES = ("isa", "pci", "i2c", "spi")  # lm-sensors bus types whose address names one physical chip


def same_chip_renamed(knob_id: str, known: Iterable[str]) -> str | None:
    """The one id of ``known`` for the same attribute of the chip at the same bus address as ``knob_id`` but
    another driver name (``hwmon:nct6798-isa-0290/pwm1`` → ``hwmon:nct6796-isa-0290/pwm1``), or None: none,
    more than one, or a bus whose address names no physical chip (``virtual``, ``acpi``)."""
    chip, _, attr = knob_id.partition("/")
    parts = chip.rsplit("-", 2)
    if len(parts) != 3 or parts[1] not in ADDRESSED_BUSES:
        return None
    family, tail = chip.partition(":")[0] + ":", f"-{parts[1]}-{parts[2]}/{attr}"
    found = [k for k in known if k.endswith(tail) and k != knob_id and k.startswith(family)]
    return found[0] if len(found) == 1 else None
