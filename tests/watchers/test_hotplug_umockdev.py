"""Hotplug under umockdev: the real daemon (hwmon backend on ``/sys``, pyudev monitor) runs in a testbed, an
hwmon chip is added while it runs — discovered, its fan taken — then removed: dropped, its knob forgotten in
the journal only once it is gone, and the stop's restore still succeeds.

The testbed is driven by the system python (PyGObject + gir1.2-umockdev-1.0, Debian packages) under
``umockdev-wrapper``; the daemon runs in the project's python with the same LD_PRELOAD and UMOCKDEV_DIR."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.machines import MACHINES_DIR, X570

HERE = Path(__file__).resolve().parent
SYSTEM_PYTHON = "/usr/bin/python3"
IT8792 = "hwmon:it8792-isa-0a20"
IT_PATH = "/sys/devices/platform/it87.2592/hwmon/hwmon5"
IT_DEVICE = """\
P: /devices/platform/it87.2592/hwmon/hwmon5
E: SUBSYSTEM=hwmon
L: device=../..
A: name=it8792\\n
A: temp1_input=45000\\n
A: temp1_crit=100000\\n
A: fan1_input=900\\n
A: pwm1=128\\n
A: pwm1_enable=2\\n

P: /devices/platform/it87.2592
E: SUBSYSTEM=platform
"""


def _have_umockdev() -> str | None:
    if shutil.which("umockdev-wrapper") is None:
        return "umockdev-wrapper not installed (scripts/system-packages.txt: umockdev)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('UMockdev', '1.0'); "
                            "from gi.repository import UMockdev"], capture_output=True)
    if probe.returncode != 0:
        return "system python lacks gi/UMockdev (python3-gi, gir1.2-umockdev-1.0)"
    return None


pytestmark = pytest.mark.skipif(_have_umockdev() is not None, reason=str(_have_umockdev()))


class UmockdevTestbed:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(["umockdev-wrapper", SYSTEM_PYTHON, str(HERE / "umockdev_ctl.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.root = json.loads(self.proc.stdout.readline())["root"]

    def __call__(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert answer["ok"], answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self(op="quit")
        self.proc.wait(timeout=10)


@pytest.fixture
def testbed():
    bed = UmockdevTestbed()
    yield bed
    bed.close()


class DaemonProc:
    def __init__(self, root: str, state: Path, policies: Path) -> None:
        env = dict(os.environ, UMOCKDEV_DIR=root, LD_PRELOAD="libumockdev-preload.so.0")
        self.log = state.parent / "daemon.log"
        self.proc = subprocess.Popen([sys.executable, str(HERE / "hotplug_daemon.py"), str(state),
                                      str(policies)], env=env, stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), text=True)
        self.events: list[list[str]] = []

    def until(self, predicate, max_snapshots: int = 600) -> dict:
        """Read snapshots (one a 0.1 s tick) until ``predicate(snapshot)``; fails after ``max_snapshots``."""
        for _ in range(max_snapshots):
            line = self.proc.stdout.readline()
            assert line, f"the daemon ended: {self.log.read_text()[-2000:]}"
            snap = json.loads(line)
            self.events += snap["events"]
            if predicate(snap):
                return snap
        raise AssertionError("condition not met")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.stdout.read()
        return self.proc.wait(timeout=20)


def journal(state: Path) -> dict:
    path = state / "journal.json"
    return {e["knob_id"]: e for e in json.loads(path.read_text())["entries"]} if path.exists() else {}


def test_an_hwmon_chip_added_and_removed_while_the_daemon_runs(testbed, tmp_path, policy_dir):
    testbed(op="load", text=(MACHINES_DIR / X570 / "machine.umockdev").read_text())
    state = tmp_path / "state"
    daemon = DaemonProc(testbed.root, state, policy_dir)
    try:
        first = daemon.until(lambda s: s["seq"] >= 2)
        assert IT8792 not in first["devices"]
        board = [d for d in first["devices"] if d.startswith("hwmon:")]
        assert board == ["hwmon:k10temp-pci-00c3", "hwmon:nct6798-isa-0290"]  # the amdgpu chip is gpu0

        testbed(op="load", text=IT_DEVICE)  # umockdev sends the "add" uevents
        added = daemon.until(lambda s: IT8792 in s["devices"])
        assert [d for d in added["devices"] if d.startswith("hwmon:")] == [
            "hwmon:k10temp-pci-00c3", IT8792, "hwmon:nct6798-isa-0290"]  # bus order
        assert ["hotplug", IT8792, f"{IT8792} added (2 channels, 1 knobs)"] in daemon.events
        daemon.until(lambda s: any(e[:2] == ["actuation", f"{IT8792}/pwm1"] for e in daemon.events))
        pwm = Path(testbed.root) / IT_PATH.lstrip("/") / "pwm1"
        assert pwm.read_text().strip() == "153"  # the policy's 60 %, written on the new chip
        assert journal(state)[f"{IT8792}/pwm1"]["saved"] == {"pwm": 128, "enable": 2}  # journaled first

        testbed(op="remove", path=IT_PATH)  # "remove", then the directory goes
        gone = daemon.until(lambda s: IT8792 not in s["devices"])
        assert [d for d in gone["devices"] if d.startswith("hwmon:")] == board  # the others' ids unchanged
        assert ["hotplug", IT8792, f"{IT8792} removed"] in daemon.events
        assert ["hotplug", f"{IT8792}/pwm1", f"{IT8792}/pwm1 gone with its device: its original stays "
                "journaled, put back if it returns (else forgotten at the next boot)"] in daemon.events
        # attack6 G9: the original stays journaled: a driver reload brings the chip back with its registers
        # as the daemon left them (a Super I/O keeps them), and only the journal knows the firmware's mode
        assert journal(state)[f"{IT8792}/pwm1"]["saved"] == {"pwm": 128, "enable": 2}
        assert "hwmon:nct6798-isa-0290/pwm1" in journal(state)  # the board's own knobs stay journaled

        back = IT_DEVICE.split("\n\n")[0] + "\n"  # its platform parent stayed
        testbed(op="load", text=back.replace("pwm1=128", "pwm1=153").replace("pwm1_enable=2", "pwm1_enable=1"))
        daemon.until(lambda s: IT8792 in s["devices"])
        assert journal(state)[f"{IT8792}/pwm1"]["saved"] == {"pwm": 128, "enable": 2}, "not the manual duty"
    finally:
        code = daemon.stop()
    assert code == 0  # every knob still journaled was restored
    assert journal(state) == {}
    assert (pwm.parent / "pwm1_enable").read_text().strip() == "2"  # the firmware's mode, not manual 60 %
