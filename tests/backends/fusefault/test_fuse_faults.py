"""Read faults at the syscall level: the recorded X570 board behind FUSE, with errnos injected into the
kernel's read path (``fusefs.py`` beside this file), read by the real backend and by ``aithermd sensors``."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.trust import SensorTrust
from aithermd.model import Status
from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.helpers import MACHINES_DIR

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

ROOT = Path(__file__).resolve().parents[3]
X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
TCTL_FILE = "0000:00:18.3/hwmon/hwmon2/temp1_input"
TCTL = "hwmon:k10temp-pci-00c3/temp1"


@pytest.fixture
def tree(tmp_path):
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as t:
        yield t


def sensors_json(root: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "aithermd", "sensors", "--json", "--sysfs-root", str(root)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    return {c["id"]: c for d in doc["devices"] for c in d["channels"]}


@pytest.mark.parametrize("code", [errno.EIO, errno.ENODATA, errno.ENXIO, errno.ENODEV])
def test_a_read_error_fails_that_channel_and_the_others_read_on(tree, code):
    backend = HwmonBackend(str(tree.mount))
    backend.discover()
    try:
        assert backend.sample().readings[TCTL].value == 32.6
        tree.fail(TCTL_FILE, code)
        sample = backend.sample()
        r = sample.readings[TCTL]
        assert (r.status, r.value) == (Status.FAILED, None)
        assert r.detail.startswith(errno.errorcode[code] + ":")
        assert sample.readings["hwmon:k10temp-pci-00c3/temp2"].value == 32.6
        assert sample.readings["hwmon:nct6798-isa-0290/temp1"].value == 28.0
    finally:
        backend.close()


def test_eagain_at_the_syscall_is_retried_within_the_same_sample(tree):
    backend = HwmonBackend(str(tree.mount))
    backend.discover()
    try:
        tree.fail(TCTL_FILE, errno.EAGAIN, times=1)
        assert backend.sample().readings[TCTL].value == 32.6
    finally:
        backend.close()


def test_one_transient_error_is_held_and_a_persistent_one_fails_at_once(tree):
    """Through the daemon's trust: EIO (and ENXIO, an i2c NAK) after a good read is held for one reading,
    ENODEV fails at once."""
    backend = HwmonBackend(str(tree.mount))
    trust = SensorTrust()
    trust.configure(backend.discover())
    try:
        assert trust.filter(0.0, backend.sample().readings)[TCTL].value == 32.6
        for t, (code, name) in enumerate(((errno.EIO, "EIO"), (errno.ENXIO, "ENXIO"))):
            tree.fail(TCTL_FILE, code)
            held = trust.filter(3.0 * t + 1.0, backend.sample().readings)[TCTL]
            assert (held.status, held.value) == (Status.OK, 32.6)
            assert held.detail.startswith(f"held: failed: {name}")
            assert trust.filter(3.0 * t + 2.0, backend.sample().readings)[TCTL].status == Status.FAILED
            tree.clear()
            assert trust.filter(3.0 * t + 3.0, backend.sample().readings)[TCTL].value == 32.6
        tree.fail(TCTL_FILE, errno.ENODEV)
        assert trust.filter(7.0, backend.sample().readings)[TCTL].status == Status.FAILED
    finally:
        backend.close()


def test_sensors_shows_status_and_reason(tree):
    tree.fail(TCTL_FILE, errno.EIO, after=1)  # the first read is good, the second fails: held
    tree.fail("0000:00:18.3/hwmon/hwmon2/temp2_input", errno.ENODEV)
    channels = sensors_json(tree.mount)
    tctl = channels[TCTL]
    assert (tctl["status"], tctl["value"], tctl["alias"]) == ("held", 32.6, None)
    assert tctl["reason"].startswith("failed: EIO: Input/output error; last good value")
    tdie = channels["hwmon:k10temp-pci-00c3/temp2"]
    assert (tdie["status"], tdie["value"], tdie["reason"]) == ("failed", None, "ENODEV: No such device")
    assert channels["hwmon:nct6798-isa-0290/temp1"]["status"] == "ok"
    assert channels["hwmon:nct6798-isa-0290/temp1"]["reason"] is None
    text = subprocess.run([sys.executable, "-m", "aithermd", "sensors", "--sysfs-root", str(tree.mount)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT).stdout
    assert "[failed: ENODEV: No such device]" in text
