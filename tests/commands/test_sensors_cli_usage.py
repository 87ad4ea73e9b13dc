"""``aithermd sensors`` usage errors: a directory that is not a sysfs tree (the fixture's machine dir without
its ``sys/``) printed "no devices found" and exit 0; ``--interval inf`` was a traceback."""

from __future__ import annotations

import argparse

import pytest

from aithermd.commands import sensors as command
from tests.backends.helpers import MACHINES_DIR

MACHINE = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args(list(argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_directory_that_is_not_a_sysfs_tree_is_a_usage_error(capsys, tmp_path):
    for root in (MACHINE, tmp_path):  # forgot the trailing sys/; an empty directory
        assert run(capsys, "--sysfs-root", str(root)) == (
            2, "", f"aithermd sensors: {root}: not a sysfs tree (no class/hwmon or class/powercap in it; "
                   "give a machine's sys/ directory)\n")
    assert run(capsys, "--interval", "0", "--sysfs-root", str(MACHINE / "sys"))[0] == 0


@pytest.mark.parametrize("interval", ["inf", "nan", "-1", "1e12"])
def test_an_interval_outside_0_to_60_s_is_a_usage_error(capsys, interval):
    assert run(capsys, "--interval", interval, "--sysfs-root", str(MACHINE / "sys")) == (
        2, "", f"aithermd sensors: --interval {float(interval):g}: give seconds from 0 to 60\n")


def test_check_against_a_directory_that_is_not_a_sysfs_tree_is_a_usage_error(capsys):
    from aithermd.cli import main
    policy = MACHINES_DIR.parents[2] / "policies" / "balanced.yaml"
    # before: every device reference was reported missing, as if the policy were wrong (exit 1)
    assert main(["check", "--sysfs-root", str(MACHINE), str(policy)]) == 2
    assert capsys.readouterr().err == (f"aithermd check: cannot use that machine: {MACHINE}: not a sysfs "
                                       "tree (no class/hwmon or class/powercap in it; give a machine's sys/ "
                                       "directory)\n")
    assert main(["check", "--sysfs-root", str(MACHINE / "sys"), str(policy)]) == 0
