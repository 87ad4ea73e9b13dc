"""Hung reads at the syscall level: the daemon runs on the recorded X570 board behind FUSE; a read of the
k10temp's Tctl blocks in the kernel and does not return. The loop ticks on: the hung chip's channels go
stale and the board fans that follow Tctl go to full, and SIGTERM stops the daemon and restores every fan
while the read still hangs.

The process itself leaves only once the read returns: a thread blocked in a read the driver (or the FUSE
server) has taken sits in uninterruptible sleep, and the kernel finishes the exit only then, for a real
hwmon driver stuck on its mutex as for FUSE (fs/fuse/dev.c, request_wait_answer). What the daemon owes —
answering SIGTERM, restoring every fan, saying "stop" — comes first and on time."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.helpers import MACHINES_DIR
from tests.support.proc import knob_files, run_args, start

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
TCTL_FILE = "0000:00:18.3/hwmon/hwmon2/temp1_input"


class Log:
    """The daemon's JSON log lines, read from its stderr by a thread (a full pipe would block the daemon)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def until(self, wanted: str | Callable[[dict], bool], timeout_s: float) -> list[dict]:
        """Events up to the first ``wanted`` one (an event name or a test), or all that came in time."""
        test = wanted if callable(wanted) else (lambda e: e.get("event") == wanted)
        seen: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if event is None:
                break
            seen.append(event)
            if test(event):
                break
        return seen


@contextmanager
def running(tree: FaultyTree, args: list[str]) -> Iterator[tuple[subprocess.Popen, Log]]:
    """The daemon started with ``args`` on ``tree`` and its log; on the way out every fault of the tree is
    cleared (a read or write held in the kernel returns) and a daemon still there is killed."""
    proc = start(args)
    try:
        yield proc, Log(proc)
    finally:
        tree.clear()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def stops_while_hung(proc: subprocess.Popen, log: Log, tree: FaultyTree,
                     restored: Callable[[], bool] = lambda: True, timeout_s: float = 30,
                     failed: Callable[[dict], bool] = lambda f: f == {}) -> None:
    """SIGTERM while the fault still holds a read or write in the kernel: the ``stop`` event comes, its
    ``failed`` knobs pass ``failed`` (default: none), and ``restored()`` holds already; then the fault is
    cleared, so the process can leave the kernel, and it exits (0 when nothing failed)."""
    proc.send_signal(signal.SIGTERM)
    stopped = log.until("stop", timeout_s)
    assert stopped[-1]["event"] == "stop" and failed(stopped[-1]["failed"]), stopped[-5:]
    assert restored()
    tree.clear()
    rc = proc.wait(timeout=30)
    assert rc == 0 or stopped[-1]["failed"], rc


def test_a_hung_read_never_holds_the_loop_or_sigterm(tmp_path):
    state = tmp_path / "state"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.mount)
        with running(tree, run_args(tree.mount, state, "--tick", "0.2")) as (proc, log):
            assert log.until("start", 60)[-1]["event"] == "start"
            tree.hang(TCTL_FILE)
            hung = log.until("read_hung", 60)
            assert hung[-1]["event"] == "read_hung" and hung[-1]["device"] == "hwmon:k10temp-pci-00c3"
            # the loop goes on: the stale Tctl is reported, and its fans are sent to full
            seen: set[str] = set()

            def both(e: dict) -> bool:
                if e.get("event") == "fault" and e.get("status") == "stale":
                    seen.add(e["subject"])
                if e.get("event") == "actuation" and e.get("rule") == "safety/failed-source":
                    seen.add(f"{e['knob']}={e['new']:g}")
                return {"hwmon:k10temp-pci-00c3/temp1", "hwmon:nct6798-isa-0290/pwm1=100"} <= seen

            log.until(both, 30)
            assert {"hwmon:k10temp-pci-00c3/temp1", "hwmon:nct6798-isa-0290/pwm1=100"} <= seen, seen
            stops_while_hung(proc, log, tree, lambda: knob_files(tree.mount) == original)  # Tctl still hung
        assert knob_files(tree.mount) == original


SYSTIN_FILE = "nct6775.656/hwmon/hwmon1/temp1_input"  # the nct6798 is read before the k10temp


def test_a_slow_chip_never_blinds_the_chips_read_after_it(tmp_path):
    """attack10 R1: every read of one nct6798 file takes 0.7 s (past the 0.5 s deadline). The k10temp read
    after it is read at every tick (no fault, never held); the slow chip is quarantined, then held for a
    back-off instead of being read, and the tick held up, again at every tick."""
    state = tmp_path / "state"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        with running(tree, run_args(tree.mount, state, "--tick", "0.2")) as (proc, log):
            assert log.until("start", 60)[-1]["event"] == "start"
            tree.slow(SYSTIN_FILE, 0.7)
            seen = log.until(lambda e: e.get("event") == "read_returned" and "held_s" in e, 60)
            assert seen[-1].get("held_s", 0) > 0, [e for e in seen if e.get("event", "").startswith("read_")]
            seen += log.until(lambda e: False, 3)  # held: the ticks go on
            hung = {e.get("device") for e in seen if e.get("event") == "read_hung"}
            assert hung == {"hwmon:nct6798-isa-0290"}, hung
            blinded = [e for e in seen if "k10temp" in str(e.get("channel", "")) + str(e.get("subject", ""))]
            assert blinded == []
            assert any(e.get("event") == "fault" and e.get("status") == "stale"
                       and str(e.get("subject", "")).startswith("hwmon:nct6798") for e in seen)
            proc.send_signal(signal.SIGTERM)
            assert log.until("stop", 30)[-1]["event"] == "stop"
            assert proc.wait(timeout=30) == 0
