"""Fan drivers that refuse, at the syscall level (issue 15): the recorded X570 board (nct6798) behind FUSE,
whose server answers chosen writes to ``pwmN``/``pwmN_enable`` with an errno as a driver's ``store()`` does
and reads of ``pwmN_enable`` with EACCES as kernfs does for a write-only attribute (dell_smm's). The real
``aithermd run`` on it, then SIGTERM, or SIGKILL and ``aithermd restore``.

Never a fan left in manual mode at a low duty: a refused mode write falls back to the duty; a fan whose mode
and duty are both refused is an ``uncontrollable`` alarm; an unreadable ``pwmN_enable`` does not stop control
and its restore hands the fan to the driver's automatic mode (nct6775: 5), journaled as such; a restore the
driver refuses leaves the fan at full duty, and says so."""

from __future__ import annotations

import errno
import json
import signal
import socket
import time
import urllib.request

import pytest

from aithermd.actuate.journal import JOURNAL_FILE, Journal
from aithermd.backends.pwm import pct_to_pwm_up
from tests.backends.fusefault import FaultyTree, copy_tree, fuse_unavailable
from tests.backends.fusefault.test_fuse_hung_reads import Log
from tests.backends.helpers import MACHINES_DIR
from tests.support.proc import knob_files, restore, run_args, start

pytestmark = pytest.mark.skipif(fuse_unavailable() is not None, reason=f"FUSE: {fuse_unavailable()}")

X570 = MACHINES_DIR / "asus-rog-strix-x570-f-nct6798-amdgpu-k10temp" / "sys"
NCT_DIR = "devices/platform/nct6775.656/hwmon/hwmon1"
PWM2_FILE, ENABLE2_FILE = "hwmon1/pwm2", "hwmon1/pwm2_enable"
PWM2 = "hwmon:nct6798-isa-0290/pwm2"


@pytest.fixture
def tree(tmp_path):
    with FaultyTree(copy_tree(X570, tmp_path / "src"), tmp_path) as t:
        yield t


def files(tree: FaultyTree) -> tuple[str, str]:
    """pwm2 and pwm2_enable as the driver holds them (the FUSE server's source, no fault in the way). The
    server writes a value as a truncate then a write, so a read between the two is empty: read again (a full
    suite read pwm2_enable empty once while the running daemon wrote it)."""
    d = tree.source / NCT_DIR
    for _ in range(200):
        pwm, enable = (d / "pwm2").read_text().strip(), (d / "pwm2_enable").read_text().strip()
        if pwm and enable:
            break
        time.sleep(0.01)
    return pwm, enable


def holds_a_duty_written(tree: FaultyTree, log: Log, events: list[dict]) -> bool:
    """pwm2 holds one of the duties the daemon said it wrote (its debug log names every write, read on for a
    second, since the line of the write just read may still be on its way; rounded up to the raw step,
    events carry short numbers)."""
    raw = int(files(tree)[0])
    events += log.until(lambda e: False, 1.0)
    return any(abs(raw - pct_to_pwm_up(e["new"])) <= 1 for e in events if actuated(PWM2)(e))


def actuated(knob: str):
    return lambda e: e.get("event") == "actuation" and e.get("knob") == knob


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, log: Log) -> list[dict]:
    proc.send_signal(signal.SIGTERM)
    seen = log.until("stop", 60)
    assert proc.wait(timeout=60) == 0
    return seen


def test_a_refused_mode_write_falls_back_to_the_duty_and_the_fan_is_still_driven(tree, tmp_path):
    """thinkpad_acpi/dell_smm-like: ``pwm2_enable := 1`` answers EINVAL; the duty is written all the same."""
    original = knob_files(tree.source)
    tree.fail_write(ENABLE2_FILE, errno.EINVAL, data="1")
    proc = start(run_args(tree.mount, tmp_path / "state", "--tick", "0.2", "--log-level", "debug"))
    log = Log(proc)
    try:
        seen = log.until(actuated(PWM2), 60)
        assert actuated(PWM2)(seen[-1]), seen
        seen += log.until(lambda e: False, 2.0)  # a few ticks more
        assert holds_a_duty_written(tree, log, seen) and files(tree)[1] == "5"  # the duty landed, the mode refused
        assert not [e for e in seen if e.get("event") == "fault" and e.get("knob") == PWM2]
        drift = [e for e in seen if e.get("event") == "drift" and e.get("knob") == PWM2]
        assert [e["why"] for e in drift] == ["mode_refused"]  # said once; the duties that follow are no drift
        assert "EINVAL on pwm2_enable := 1" in drift[0]["message"]
        stopped = stop(proc, log)
    finally:
        _kill(proc)
    assert stopped[-1]["failed"] == {}
    assert knob_files(tree.source) == original  # pwm 88 then enable 5 again


def test_a_fan_whose_mode_and_duty_are_both_refused_is_an_uncontrollable_alarm(tree, tmp_path):
    """amdgpu-like: the duty only in manual mode, and the mode write refused: the fan cannot be controlled;
    the alarm is raised (log, metric) and every other fan runs on."""
    original = knob_files(tree.source)
    tree.fail_write(ENABLE2_FILE, errno.EINVAL, data="1")
    tree.fail_write(PWM2_FILE, errno.EINVAL)
    port = free_port()
    args = run_args(tree.mount, tmp_path / "state", "--tick", "0.2", "--log-level", "debug")
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{port}"
    proc = start(args)
    log = Log(proc)
    try:
        seen = log.until(lambda e: e.get("event") == "fault" and e.get("knob") == PWM2, 60)
        assert "this fan cannot be controlled" in seen[-1]["message"], seen[-1]
        assert any(actuated("hwmon:nct6798-isa-0290/pwm1")(e) for e in seen)  # the others run on
        metrics = ""
        for _ in range(100):  # the next snapshot carries the alarm
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            if f'aithermd_knob_uncontrollable{{knob="{PWM2}"}} 1.0' in metrics:
                break
            log.until(lambda e: False, 0.2)
        assert f'aithermd_knob_uncontrollable{{knob="{PWM2}"}} 1.0' in metrics
        assert 'aithermd_knob_uncontrollable{knob="hwmon:nct6798-isa-0290/pwm1"} 0.0' in metrics
        stopped = stop(proc, log)
    finally:
        _kill(proc)
    assert stopped[-1]["failed"] == {}
    assert knob_files(tree.source) == original  # nothing of pwm2 was ever changed


def test_a_write_only_pwm_enable_then_sigkill_then_aithermd_restore_hands_the_fan_to_auto(tree, tmp_path):
    """dell_smm's ``pwmN_enable`` is write-only (EACCES on every read, root included): control goes on, the
    journal says the mode could not be read, and ``aithermd restore`` after a SIGKILL puts the fan in the
    driver's automatic mode (nct6775: 5), with a warning."""
    original = knob_files(tree.source)
    tree.fail(ENABLE2_FILE, errno.EACCES)
    state = tmp_path / "state"
    proc = start(run_args(tree.mount, state, "--tick", "0.2", "--log-level", "debug"))
    log = Log(proc)
    try:
        seen = log.until(actuated(PWM2), 60)
        assert actuated(PWM2)(seen[-1]), seen
        seen += log.until(lambda e: False, 2.0)
        assert holds_a_duty_written(tree, log, seen) and files(tree)[1] == "1"  # manual mode written blind
        journal = json.loads((state / JOURNAL_FILE).read_text())  # on disk, as a crash leaves it
        saved = next(e["saved"] for e in journal["entries"] if e["knob_id"] == PWM2)
        assert saved == {"pwm": 88, "enable": None, "enable_unreadable": "EACCES", "auto": 5}
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert files(tree)[1] == "1"  # SIGKILL: nothing was put back
    out = restore(state)
    assert out.returncode == 0, out.stderr
    assert "the original mode could not be read (EACCES): handed to the driver's automatic mode (enable 5)" \
        in out.stderr
    assert files(tree)[1] == "5"
    rest = {k: v for k, v in knob_files(tree.source).items() if not k.endswith("/pwm2")}
    assert rest == {k: v for k, v in original.items() if not k.endswith("/pwm2")}
    assert not Journal(state).dirty


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_restore_the_driver_refuses_leaves_the_fan_at_full_duty_and_says_so(tree, tmp_path, how):
    """The driver refuses the automatic mode on the way out (EINVAL on ``pwm2_enable := 5``): pwm2 is not
    left in manual mode at the daemon's low duty but at full duty, and the daemon (or ``aithermd restore``
    after a crash) says so."""
    original = knob_files(tree.source)
    state = tmp_path / "state"
    proc = start(run_args(tree.mount, state, "--tick", "0.2", "--log-level", "debug"))
    log = Log(proc)
    try:
        seen = log.until(actuated(PWM2), 60)
        assert actuated(PWM2)(seen[-1]), seen
        assert seen[-1]["new"] < 100
        log.until(lambda e: files(tree)[1] == "1", 10)
        assert files(tree)[1] == "1"
        tree.fail_write(ENABLE2_FILE, errno.EINVAL, data="5")
        if how == "sigterm":
            stopped = stop(proc, log)
            fallback = [e for e in stopped if e.get("event") == "restore_fallback"]
            assert [e["knob"] for e in fallback] == [PWM2]
            message = fallback[0]["message"]
            assert stopped[-1]["failed"] == {}
        else:
            proc.kill()
            proc.wait(timeout=60)
            out = restore(state)
            assert out.returncode == 0, out.stderr
            message = out.stderr
    finally:
        _kill(proc)
    assert "restoring the original failed" in message and "left at full duty (pwm 255) instead" in message
    assert files(tree) == ("255", "1")
    rest = {k: v for k, v in knob_files(tree.source).items() if "/pwm2" not in k}
    assert rest == {k: v for k, v in original.items() if "/pwm2" not in k}


def _kill(proc) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
