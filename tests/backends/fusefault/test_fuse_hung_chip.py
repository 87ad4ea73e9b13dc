"""A chip whose reads hang is not written (attack10 W2, W1r): the daemon runs on the recorded X570 board
behind FUSE; reads of one nct6798 file block in the kernel. The read guard quarantines the chip, and from then
on its fans are neither written nor read back on the loop (once, a safety write to full through the hung chip
froze the loop: one lock in the driver holds its reads and writes alike; reading ``pwm1`` back froze it too).
The loop ticks on — the GPU's fan follows its temperature — the chip's knobs carry an ``uncontrollable`` alarm
("its chip does not answer"), control resumes once the read returns, and SIGTERM stops the daemon and
restores every fan while the read still hangs.

Ticks are told by events (the GPU fan's actuations), never by durations."""

from __future__ import annotations

import urllib.request

import pytest

from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.fusefault.test_fuse_fan_writes import free_port
from tests.backends.fusefault.test_fuse_hung_reads import Log, running, stops_while_hung
from tests.backends.helpers import MACHINES_DIR
from tests.support.proc import knob_files, restore, run_args

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT = "hwmon:nct6798-isa-0290"
GPU_DIR = "devices/pci0000:00/0000:07:00.0/hwmon/hwmon0"
GPU_FAN = "gpu0/fan0"


def nct_actuation(e: dict) -> bool:
    return e.get("event") == "actuation" and str(e.get("knob", "")).startswith(NCT + "/")


def gpu_heats(tree: FaultyTree) -> None:
    """The GPU's temperatures to 70 °C (the FUSE server's source; under its critical line): its fan must go
    up, tick after tick (its ramp)."""
    for path in (tree.source / GPU_DIR).glob("temp*_input"):
        path.write_text("70000\n")


def gpu_fan_follows(log: Log, seen: list[dict], timeout_s: float = 60) -> bool:
    """Reads events until two actuations moved the GPU fan (two ticks that wrote another device: up to the
    temperature, or down from the start's full duty)."""
    ups = 0

    def test(e: dict) -> bool:
        nonlocal ups
        if e.get("event") == "actuation" and e.get("knob") == GPU_FAN and e.get("old") is not None \
                and e["new"] != e["old"]:
            ups += 1
        return ups >= 2

    seen += log.until(test, timeout_s)
    return ups >= 2


def metrics(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_a_quarantined_chip_is_not_written_its_fans_alarm_and_control_resumes_when_it_answers(tmp_path):
    """W2: reads of the nct6798's SYSTIN hang (the driver's lock): no write to its fans while held (the old
    code sent them to full through the hung chip), an ``uncontrollable`` alarm on each, the GPU's fan still
    follows; once the read returns, the chip is written again, and the stop restores every fan."""
    port = free_port()
    args = run_args(tmp_path / "mnt", tmp_path / "state", "--tick", "0.2", "--log-level", "debug")
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{port}"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.source)
        with running(tree, args) as (proc, log):
            assert any(nct_actuation(e) for e in log.until(nct_actuation, 60))
            tree.hang("hwmon1/temp1_input")
            hung = log.until("read_hung", 60)
            assert hung[-1]["event"] == "read_hung" and hung[-1]["device"] == NCT
            seen: list[dict] = []
            gpu_heats(tree)
            assert gpu_fan_follows(log, seen), seen  # the loop ticks on, and writes the other devices
            assert not [e for e in seen if nct_actuation(e)]  # nothing sent to the hung chip, not even full
            held = [e for e in seen if e.get("event") == "fault" and e.get("why") == "unanswered"]
            assert held and "does not answer" in held[0]["message"], held
            text = ""
            for _ in range(100):  # the next snapshot carries the alarm
                text = metrics(port)
                if f'aithermd_knob_uncontrollable{{knob="{NCT}/pwm1"}} 1.0' in text:
                    break
                log.until(lambda e: False, 0.2)
            assert f'aithermd_knob_uncontrollable{{knob="{NCT}/pwm1"}} 1.0' in text
            assert f'aithermd_knob_uncontrollable{{knob="{GPU_FAN}"}} 0.0' in text
            tree.clear()  # the read returns: the chip answers again, and is controlled again
            back = log.until(nct_actuation, 60)
            assert any(e.get("event") == "recovered" and e.get("why") == "unanswered" for e in back), back
            assert nct_actuation(back[-1]), back
            stops_while_hung(proc, log, tree, timeout_s=60)  # nothing hangs any more
        assert knob_files(tree.source) == original


def test_a_knob_whose_reads_hang_from_the_start_never_holds_the_loop_or_sigterm(tmp_path):
    """W1r: reads of ``pwm1`` hang from the start. The chip is quarantined at the first pass and its knobs are
    not read back on the loop (the old code froze there, reading pwm1's original for the journal): the GPU's
    fan follows its temperature, and SIGTERM stops the daemon, every fan restored, while the read hangs."""
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.source)
        tree.hang("hwmon1/pwm1")
        args = run_args(tree.mount, tmp_path / "state", "--tick", "0.2", "--log-level", "debug")
        with running(tree, args) as (proc, log):
            seen = log.until("read_hung", 60)
            assert seen[-1]["event"] == "read_hung" and seen[-1]["device"] == NCT, seen
            gpu_heats(tree)
            assert gpu_fan_follows(log, seen), seen
            assert not [e for e in seen if nct_actuation(e)]
            # while the pwm1 read still hangs in the kernel
            stops_while_hung(proc, log, tree, lambda: knob_files(tree.source) == original, timeout_s=60)
        assert knob_files(tree.source) == original  # nothing more: the source holds what the stop restored


def test_the_fans_held_on_a_chip_whose_knob_read_hangs_go_to_full_duty(tmp_path):
    """W1r-res (attack12): reads of ``pwm1`` hang once the daemon holds the nct6798's fans at the curve's
    low duty, its writes still work. The old code left them where they were (manual, 34-47 %) for as long as
    the read hung; now each fan the daemon holds gets one write of full duty off the loop (manual, 255), the
    loop ticks on, and the stop restores every fan while the read still hangs."""
    state = tmp_path / "state"
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as tree:
        original = knob_files(tree.source)
        args = run_args(tree.mount, state, "--tick", "0.2", "--log-level", "debug")
        with running(tree, args) as (proc, log):
            assert any(nct_actuation(e) for e in log.until(nct_actuation, 60))
            tree.hang("hwmon1/pwm1")
            seen = log.until(lambda e: e.get("event") == "fault" and e.get("why") == "unanswered_full", 60)
            assert seen and seen[-1].get("why") == "unanswered_full", seen[-5:]
            held = seen[-1]["knobs"]
            assert f"{NCT}/pwm1" in held, held
            done: set[str] = set()

            def written(e: dict) -> bool:
                if e.get("event") == "unanswered_full_written":
                    done.add(e["knob"])
                return done == set(held)

            seen += log.until(written, 60)
            assert done == set(held), seen[-5:]
            files = knob_files(tree.source)
            for knob in held:
                name = knob.rsplit("/", 1)[1]
                path = next(p for p in files if p.startswith("devices/platform/nct6775.656") and
                            p.endswith(f"/{name}"))
                assert (files[path], files[path + "_enable"]) == ("255\n", "1\n"), (path, files)
            gpu_heats(tree)
            assert gpu_fan_follows(log, seen), seen  # the loop ticks on
            # while the pwm1 read still hangs. When a write's read-back of pwm1 hung before the guard's read
            # did, the chip is held write hung too: its knobs are left journaled (attack10 W1's rule)
            stops_while_hung(proc, log, tree, timeout_s=60, failed=lambda f: all(
                k.startswith(NCT + "/") and "does not answer" in why for k, why in f.items()))
        done = restore(state, "--sysfs-root", str(tree.mount))  # ExecStopPost (nothing left, or the chip)
        assert done.returncode == 0, done.stderr[-2000:]
        assert knob_files(tree.source) == original
