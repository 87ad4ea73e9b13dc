"""The benchmarks' reference chip: one nct6798 with 6 temperatures, 3 fans and 3 pwm (issue 22's reference
tree), in sysfs units (m°C, RPM, pwm 0–255). bench_tick, bench_process and tests/runtime/test_tick_calls
build it here."""

from __future__ import annotations

from pathlib import Path

LABELS = ("Tctl", "Tccd1", "SYSTIN", "AUXTIN0", "AUXTIN1", "PCH_CHIP_TEMP")
TEMPS_MC = (52_000, 49_500, 36_000, 38_500, 33_000, 45_000)


def reference_chip(root: Path) -> list[Path]:
    """Write the chip as ``root``/class/hwmon/hwmon0; returns its temp*_input files."""
    chip = root / "class" / "hwmon" / "hwmon0"
    chip.mkdir(parents=True)
    (chip / "name").write_text("nct6798\n")
    files = []
    for i, (label, mc) in enumerate(zip(LABELS, TEMPS_MC, strict=True), start=1):
        (chip / f"temp{i}_input").write_text(f"{mc}\n")
        (chip / f"temp{i}_label").write_text(f"{label}\n")
        (chip / f"temp{i}_crit").write_text("100000\n")
        files.append(chip / f"temp{i}_input")
    for i in range(1, 4):
        (chip / f"fan{i}_input").write_text(f"{800 + 100 * i}\n")
        (chip / f"pwm{i}").write_text("128\n")
        (chip / f"pwm{i}_enable").write_text("5\n")
    return files
