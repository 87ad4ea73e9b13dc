"""Slow sensors (nvme, drivetemp): split off the inline hwmon backend with the same ids, read in a worker of
their own; a late or missing value is stale (last value carried), a hung read never holds up sample()."""

from __future__ import annotations

import threading
import time

import pytest

from aithermd.backends.hwmon import HwmonBackend
from aithermd.backends.hwmon_subset import HwmonSubset
from aithermd.backends.slow import SlowBackend, SlowOptions, split_slow
from aithermd.model import Reading, Status
from tests.support.clock import SimClock
from tests.support.fake_backend import ScriptedSensor as Scripted
from tests.support.machines import MACHINES, Z690, copy_machine, machine_root

OPTS = SlowOptions(cadence_s=5.0, deadline_s=2.0, first_wait_s=0.0)


@pytest.mark.parametrize("machine", MACHINES)
def test_the_split_keeps_every_id_and_puts_only_slow_chips_in_the_slow_lane(machine):
    root = str(machine_root(machine))
    full = HwmonBackend(root).discover()
    backends = split_slow([HwmonBackend(root)], SlowOptions(first_wait_s=0.0))
    try:
        found = {id(b): b.discover() for b in backends}
        ids = [d.id for b in backends for d in found[id(b)]]
        assert sorted(ids) == sorted(d.id for d in full)
        inline = found[id(backends[0])]
        assert isinstance(backends[0], HwmonSubset)
        assert all(d.name not in ("nvme", "drivetemp") for d in inline)
        for b in backends[1:]:
            assert b.kind == "hwmon-slow" and b.locator()["lane"] == "slow"
            assert all(d.name in ("nvme", "drivetemp") and not d.knobs for d in found[id(b)])
    finally:
        for b in backends:
            b.close()


def test_a_slow_driver_chip_with_pwm_knobs_stays_inline(tmp_path):
    root = copy_machine(tmp_path, Z690)
    nvme = next(p for p in (root / "class" / "hwmon").iterdir() if (p / "name").read_text().strip() == "nvme")
    (nvme / "pwm1").write_text("128\n")
    inline = HwmonSubset(str(root), keep="except")
    slow = HwmonSubset(str(root), drivers=("nvme",), keep="only")
    assert "hwmon:nvme-pci-0200" in [d.id for d in inline.discover()]
    assert slow.discover() == []


CID = Scripted.CID


def test_fresh_stale_and_late_values():
    clock = SimClock()
    inner = Scripted(clock)
    slow = SlowBackend(lambda: inner, OPTS, clock, start=False)
    assert [d.id for d in slow.discover()] == ["hwmon:nvme-pci-0200"]
    first = slow.sample().readings[CID]
    assert (first.value, first.status, first.detail) == (None, Status.STALE, "no reading yet")
    slow.reader.read_once()
    assert slow.sample().readings[CID] == Reading(CID, 40.0)  # on time: the read itself
    clock.advance(5.0 + 2.0 + 0.1)  # the next read is overdue
    r = slow.sample().readings[CID]
    assert (r.value, r.status, r.detail) == (40.0, Status.STALE, "no read within its 2 s deadline")
    inner.value, inner.duration_s = 42.0, 3.0  # answers, but past its deadline: a late value is stale
    slow.reader.read_once()
    r = slow.sample().readings[CID]
    assert (r.value, r.status, r.detail) == (42.0, Status.STALE, "read took 3 s, deadline 2 s")
    assert slow.reader.late == 1
    inner.value, inner.duration_s = 43.0, 0.2
    slow.reader.read_once()
    assert slow.sample().readings[CID] == Reading(CID, 43.0)


def test_a_failing_read_keeps_the_last_sample_until_it_goes_stale():
    clock = SimClock()
    inner = Scripted(clock)
    slow = SlowBackend(lambda: inner, OPTS, clock, start=False)
    slow.discover()
    slow.reader.read_once()
    inner.fail = True
    slow.reader.read_once()
    assert slow.reader.failures == 1 and slow.sample().readings[CID] == Reading(CID, 40.0)
    clock.advance(7.5)
    assert slow.sample().readings[CID].status == Status.STALE
    inner.fail, inner.status = False, Status.FAILED  # a failed reading stays failed, never "stale"
    slow.reader.read_once()
    clock.advance(7.5)
    assert slow.sample().readings[CID].status == Status.FAILED


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def test_a_hung_read_never_holds_up_the_loop_and_rediscovery_replaces_its_reader():
    clock = SimClock()
    gate = threading.Semaphore(0)
    hung, fresh = Scripted(clock, gate), Scripted(clock)
    made = iter([Scripted(clock), hung, fresh])  # the first only names the kind and locator
    slow = SlowBackend(lambda: next(made), OPTS, clock)
    slow.discover()  # the reader thread is now stuck in its first read
    old = slow.reader
    for _ in range(1000):  # the loop samples on: nothing waits for the thread
        r = slow.sample().readings[CID]
    assert r.status == Status.STALE and old.reads == 0
    slow.discover()  # hotplug: a new inner backend and reader; the hung one is retired, not touched
    assert slow.reader is not old and old.retired
    wait_until(lambda: slow.reader.reads >= 1)
    assert slow.sample().readings[CID] == Reading(CID, 40.0)
    assert not hung.closed
    gate.release()  # the drive answers at last: the old thread ends and closes its backend
    wait_until(lambda: hung.closed)
    slow.close()
    wait_until(lambda: fresh.closed)
