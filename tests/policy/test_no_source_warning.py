"""A policy whose fan curve finds no temperature sensor on the machine is a loud warning at start, reload
and hotplug, naming the fans that will run at 100 % (recorded X570 board)."""

from __future__ import annotations

import textwrap

from aithermd.backends.registry import discover, open_backends
from aithermd.policy.devicecheck import unsourced_fans
from aithermd.policy.loader import load_policy_file, load_policy_text, shipped_policy_dir
from aithermd.runtime.changes import unsourced_message
from tests.backends.helpers import MACHINES_DIR
from tests.support.machines import copy_machine

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NOWHERE = """
curves:
  board: {kind: points, source: {max: ["Package id *"]}, points: [[40, 30], [85, 100]]}
rules:
  - {name: board-fans, kind: fan, fans: {chip: "nct*"}, curve: board}
"""


def devices(root=X570):
    backends = open_backends(str(root), cpu=False)
    try:
        return tuple(discover(backends).devices)
    finally:
        for b in backends:
            b.close()


def test_a_curve_without_a_source_here_is_named_with_its_fans():
    policy = load_policy_text(textwrap.dedent(NOWHERE), name="intel-only")
    (found,) = unsourced_fans(policy, devices())
    assert found[:2] == ("board-fans", "board")
    assert found[2] == tuple(f"hwmon:nct6798-isa-0290/pwm{n}" for n in range(1, 7))


def test_the_warning_names_the_fans_and_what_to_do():
    policy = load_policy_text(textwrap.dedent(NOWHERE), name="intel-only")
    ((rule, curve, fans),) = unsourced_fans(policy, devices())
    message = unsourced_message("intel-only", rule, curve, fans)
    assert message.startswith("policy intel-only, rule board-fans: curve board selects no temperature sensor")
    assert "6 fan(s) run at 100 %" in message and "aithermd sensors" in message


def test_shipped_policies_warn_on_no_recorded_machine_with_fans(tmp_path):
    """On an older kernel (unlabelled k10temp) the shipped policies still find the CPU: no warning."""
    root = copy_machine(tmp_path, X570.parent.name)
    for label in (root / "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2").glob("temp*_label"):
        label.unlink()
    found = devices(root)
    for name in ("balanced", "ai-training", "quiet"):
        assert unsourced_fans(load_policy_file(shipped_policy_dir() / f"{name}.yaml"), found) == []
