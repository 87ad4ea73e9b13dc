"""A restore past a fan write that never returns (attack10 W3): the recorded X570 board (nct6798 fans, the
amdgpu's fan) behind FUSE, journaled and left at 30 % manual as a crashed daemon leaves it; then writes to
chosen ``pwmN`` files block in the kernel, as a driver's ``store()`` stuck on its lock does, and the real
``aithermd restore`` runs (in this process, with its deadline made short).

It returns, exit 1, with every other knob back as found; the hung knob's entry stays journaled (a later
``aithermd restore`` finishes it), and so do those of its chip it could not reach. Once the driver lets go,
the restore left behind finishes the knob it was in: never a fan left manual at a low duty."""

from __future__ import annotations

import threading
import time

import pytest

from aithermd.actuate import restore_devices
from aithermd.actuate.journal import Journal
from aithermd.backends.registry import open_backend
from aithermd.cli import main
from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.helpers import MACHINES_DIR
from tests.support.proc import knob_files

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT = "hwmon:nct6798-isa-0290"
GPU_FAN = "gpu0/fan0"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setattr(restore_devices, "RESTORE_DEADLINE_S", 1.0)
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as t:
        yield t
        t.clear()
        left_behind()


def left_behind() -> None:
    """Wait for the restore threads left in a write (the fault is cleared: each returns)."""
    for thread in threading.enumerate():
        if thread.name == restore_devices.THREAD_NAME:
            thread.join(30)


def crash(tree: FaultyTree, state) -> dict[str, str]:
    """Journal every fan of the board as the daemon does (original first) and leave it at 30 % manual, as
    a SIGKILLed daemon does: the GPU's fan first, the nct6798's pwm1..6 after (restored newest first).
    Returns the originals (knob file → content)."""
    original = knob_files(tree.source)
    journal = Journal(state)
    for kind in ("hwmon-gpu", "hwmon"):
        backend = open_backend({"backend": kind, "sysfs_root": str(tree.mount)})
        knobs = [k for d in backend.discover() for k in d.knobs if k.id == GPU_FAN or k.id.startswith(NCT)]
        for knob_id, device_id in sorted((k.id, k.device_id) for k in knobs):
            journal.record(knob_id, device_id, backend.locator(), backend.save_knob(knob_id), time.time())
            backend.write_knob(knob_id, 30.0)
        backend.close()
    assert set(journal.entries()) == {GPU_FAN, *(f"{NCT}/pwm{i}" for i in range(1, 7))}
    assert knob_files(tree.source) != original
    return original


def restore_returns(state, capsys) -> tuple[int, str]:
    """``aithermd restore`` in a thread of its own; its exit code and stderr once it returned (the test fails,
    rather than hangs, when it does not: the hung write is released after 60 s)."""
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(main(["restore", "--state-dir", str(state)])))
    thread.start()
    thread.join(60)
    returned = not thread.is_alive()
    return (out[0] if returned else -1), capsys.readouterr().err if returned else "the restore never returned"


def test_a_fan_write_that_never_returns_holds_up_no_other_fan(tree, tmp_path, capsys):
    state = tmp_path / "state"
    original = crash(tree, state)
    tree.hang_write("hwmon1/pwm5")
    code, err = restore_returns(state, capsys)
    assert err != "the restore never returned"
    assert code == 1
    now = knob_files(tree.source)
    wrong = {f for f in original if now[f] != original[f]}
    assert {f.rsplit("/", 1)[1] for f in wrong} <= {"pwm5", "pwm5_enable"}, "every other fan as found"
    assert set(Journal(state).entries()) == {f"{NCT}/pwm5"}, "the hung knob stays journaled, only it"
    assert f"{NCT}/pwm5: hung" in err
    tree.clear()
    left_behind()  # the driver lets go: the restore left in the write finishes its knob
    assert knob_files(tree.source) == original
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert not Journal(state).dirty


def test_a_chip_whose_writes_all_hang_keeps_its_entries_and_the_other_device_is_restored(tree, tmp_path,
                                                                                          capsys):
    state = tmp_path / "state"
    original = crash(tree, state)
    for i in range(1, 7):  # a driver stuck on its lock: no store() of the chip returns
        tree.hang_write(f"hwmon1/pwm{i}")
    code, err = restore_returns(state, capsys)
    assert err != "the restore never returned"
    assert code == 1
    now = knob_files(tree.source)
    gpu = [f for f in original if "/hwmon1/" not in f]
    assert gpu and all(now[f] == original[f] for f in gpu), "the GPU's fan as found"
    entries = Journal(state).entries()
    assert set(entries) == {f"{NCT}/pwm{i}" for i in range(1, 7)}, "the chip's originals all kept"
    said = {line.split(": ")[2]: line for line in err.splitlines()
            if line.startswith("aithermd restore: error")}
    assert set(said) == set(entries)
    assert f"{NCT}/pwm6: hung" in said[f"{NCT}/pwm6"], "the first one tried is named hung"
    tree.clear()
    left_behind()
    assert main(["restore", "--state-dir", str(state)]) == 0
    assert knob_files(tree.source) == original


def test_a_hung_read_of_a_fan_mode_never_leaves_an_automatic_fan_manual(tree, tmp_path, capsys):
    """restore8: reads of ``pwm5_enable`` hang. pwm5's original is automatic (SmartFan, enable 5): its mode is
    written first and nothing is read, so the restore returns with every fan as found while the read still
    hangs (the old order wrote the duty, read the mode and hung there: pwm5 manual at duty 0)."""
    state = tmp_path / "state"
    original = crash(tree, state)
    assert original["devices/platform/nct6775.656/hwmon/hwmon1/pwm5_enable"] == "5\n"
    tree.hang("hwmon1/pwm5_enable")
    code, err = restore_returns(state, capsys)
    assert code == 0 and "error" not in err, err
    assert knob_files(tree.source) == original, "every fan as found, pwm5 automatic"
    assert not Journal(state).dirty
