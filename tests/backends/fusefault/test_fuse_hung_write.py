"""A fan write that blocks in the driver never holds the loop (attack10 W1): the daemon runs on the recorded
X570 board behind FUSE; writes of the nct6798's ``pwm2`` block in the kernel, as a ``store()`` stuck on the
driver's lock does. The write is given up on after the writer's deadline (``write_hung``), the chip is held
(nothing more written to it or read back) while the loop ticks on — the GPU's fan follows its temperature —
and SIGTERM stops the daemon while the write still hangs: every other fan restored, the chip's knobs left
journaled for ``aithermd restore``, which puts them back once the chip answers. The same when the chip's
reads and writes all hang (W2: one lock in the driver): quarantined, never written, its restore at the stop
given up on after the restore's deadline per device (attack10 W3).

Ticks are told by events (the GPU fan's actuations), never by durations."""

from __future__ import annotations

import pytest

from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.fusefault.test_fuse_hung_chip import NCT, X570, gpu_fan_follows, gpu_heats, nct_actuation
from tests.backends.fusefault.test_fuse_hung_reads import running, stops_while_hung
from tests.support.proc import knob_files, restore, run_args

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

TCTL_FILE = "0000:00:18.3/hwmon/hwmon2/temp1_input"
K10_DIR = "devices/pci0000:00/0000:00:18.3/hwmon/hwmon2"


def test_a_hung_fan_write_never_holds_the_loop_or_sigterm_and_its_chip_is_restored_later(tmp_path):
    state = tmp_path / "state"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.source)
        args = run_args(tree.mount, state, "--tick", "0.2", "--log-level", "debug")
        with running(tree, args) as (proc, log):
            assert any(nct_actuation(e) for e in log.until(nct_actuation, 60))
            tree.hang_write("hwmon1/pwm2")
            for name in ("temp1_input", "temp2_input"):  # Tctl, Tdie: the board curve moves every fan
                (tree.source / K10_DIR / name).write_text("80000\n")
            hung = log.until("write_hung", 60)  # (the old code froze in the write: no line at all)
            assert hung and hung[-1]["event"] == "write_hung" and hung[-1]["knob"] == f"{NCT}/pwm2", hung[-3:]
            seen: list[dict] = []
            gpu_heats(tree)
            assert gpu_fan_follows(log, seen), seen  # the loop ticks on, and writes the other devices
            assert not [e for e in seen if nct_actuation(e)]  # the chip is held: nothing more written to it
            held = [e for e in hung + seen if e.get("event") == "fault" and e.get("why") == "write_hung"]
            assert held and held[0]["subject"] == f"{NCT}/pwm2", held
            # while the pwm2 write still hangs in the kernel: the chip's knobs left journaled, no other
            stops_while_hung(proc, log, tree, timeout_s=60, failed=lambda f: (
                "does not answer" in f.get(f"{NCT}/pwm2", "") and all(k.startswith(NCT + "/") for k in f)))
        done = restore(state, "--sysfs-root", str(tree.mount))  # ExecStopPost: the chip answers again
        assert done.returncode == 0, done.stderr[-2000:]
        assert knob_files(tree.source) == original


def test_a_chip_whose_reads_and_writes_hang_never_holds_the_stop(tmp_path):
    """W2 as a stuck driver has it (one lock): reads of SYSTIN and writes of every fan of the nct6798 hang.
    The chip is quarantined and never written; SIGTERM stops the daemon while it hangs: the GPU's fan is
    restored, the chip's restore is given up on after the stop's deadline and its knobs stay journaled, and
    ``aithermd restore`` puts them back once the chip answers."""
    state = tmp_path / "state"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.source)
        args = run_args(tree.mount, state, "--tick", "0.2", "--log-level", "debug")
        with running(tree, args) as (proc, log):
            assert any(nct_actuation(e) for e in log.until(nct_actuation, 60))
            for n in range(1, 7):  # pwmN and pwmN_enable, every fan of the chip
                tree.hang_write(f"hwmon1/pwm{n}")
                tree.hang_write(f"hwmon1/pwm{n}_enable")
            tree.hang("hwmon1/temp1_input")
            hung = log.until("read_hung", 60)
            assert hung and hung[-1]["device"] == NCT, hung[-3:]
            seen: list[dict] = []
            gpu_heats(tree)
            assert gpu_fan_follows(log, seen), seen
            assert not [e for e in seen if nct_actuation(e)]
            # while the chip's reads and writes still hang: its restore given up on, its knobs journaled
            stops_while_hung(proc, log, tree, timeout_s=60, failed=lambda f: bool(f) and all(
                k.startswith(NCT + "/") and "hung" in v for k, v in f.items()))
        done = restore(state, "--sysfs-root", str(tree.mount))
        assert done.returncode == 0, done.stderr[-2000:]
        assert knob_files(tree.source) == original
