"""The energy history's report: its rows add up to its total, whatever it is grouped by."""

from __future__ import annotations

import math
import time

import pytest

from aithermd.accounting.attribution import Holder, split_cpu, split_gpu
from aithermd.accounting.cgroups import CgroupIdentity
from aithermd.accounting.history import EnergyHistory
from aithermd.accounting.procs import ProcessInfo

TRAIN = ProcessInfo(4100, 10.0, user="ana", comm="python", cgroup=CgroupIdentity(
    "/system.slice/slurmstepd.scope/job_7/step_0", unit="slurmstepd.scope", slurm_job=7))
SHELL = ProcessInfo(1850, 5.0, user="you", comm="gnome-shell", cgroup=CgroupIdentity(
    "/user.slice/user-1000.slice/user@1000.service/org.gnome.Shell@wayland.service",
    unit="org.gnome.Shell@wayland.service"))
INFO = {p.key: p for p in (TRAIN, SHELL)}
DAY1 = time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))  # local noon: the next day is 86400 s on


def _history() -> EnergyHistory:
    h = EnergyHistory()
    # day 1: a Slurm job and the desktop share gpu0 (300 W for 10 s, 60 W floor); the CPU package runs
    # the job alone (100 J, 40 J floor); gpu1 is held by nobody (idle and active stay unattributed)
    h.add(split_gpu("gpu0", 3000.0, 10.0, 60.0, [Holder(TRAIN.key, busy=90.0), Holder(SHELL.key, busy=10.0)]),
          INFO.__getitem__, DAY1)
    h.add(split_cpu("package-0", 100.0, 10.0, 4.0, {TRAIN.key: 8.0}), INFO.__getitem__, DAY1)
    h.add(split_gpu("gpu1", 500.0, 10.0, 30.0, []), INFO.__getitem__, DAY1)
    # day 2: only the desktop
    h.add(split_gpu("gpu0", 800.0, 10.0, 60.0, [Holder(SHELL.key, busy=3.0)]), INFO.__getitem__, DAY1 + 86400)
    return h


@pytest.mark.parametrize("by", ["job", "unit", "container", "process", "day"])
def test_the_rows_add_up_to_the_total_per_device(by):
    report = _history().report(DAY1 - 3600, by)
    assert report["total"]["joules"] == {"gpu0": 3800.0, "gpu1": 500.0, "package-0": 100.0}
    for device, total in report["total"]["joules"].items():
        assert math.fsum(r["joules"].get(device, 0.0) for r in report["rows"]) == pytest.approx(total)
    assert math.fsum(r["total_j"] for r in report["rows"]) == pytest.approx(4400.0)


def test_by_job_the_energy_of_no_job_is_its_own_row():
    report = _history().report(DAY1 - 3600, "job")
    rows = {r["name"]: r for r in report["rows"]}
    assert [r["name"] for r in report["rows"]] == ["slurm:7", "(none)", "(idle)", "(unattributed)"]
    # the job: 90 % of gpu0's active 2400 J + half its 600 J floor; the CPU's active 60 J
    assert rows["slurm:7"]["joules"] == {"gpu0": pytest.approx(2460.0), "package-0": pytest.approx(60.0)}
    assert rows["slurm:7"]["users"] == ["ana"] and "rest" not in rows["slurm:7"]
    # the desktop, in no job: 10 % of 2400 J + 300 J on day 1, all of day 2's 800 J
    assert rows["(none)"]["joules"] == {"gpu0": pytest.approx(540.0 + 800.0), "gpu1": 0.0, "package-0": 0.0}
    assert rows["(idle)"]["joules"] == {"gpu0": 0.0, "gpu1": 300.0, "package-0": 40.0}
    assert rows["(unattributed)"]["joules"] == {"gpu0": 0.0, "gpu1": 200.0, "package-0": 0.0}
    assert all(rows[n]["rest"] is True for n in ("(none)", "(idle)", "(unattributed)"))


def test_by_job_only_the_energy_since_the_first_day_counts():
    h = _history()
    h.add(split_gpu("gpu0", 1000.0, 10.0, 0.0, [Holder(TRAIN.key, busy=50.0)]), INFO.__getitem__,
          DAY1 + 2 * 86400)
    report = h.report(DAY1 + 2 * 86400 - 3600, "job")
    assert [(r["name"], r["total_j"]) for r in report["rows"]] == [
        ("slurm:7", 1000.0), ("(none)", 0.0), ("(idle)", 0.0), ("(unattributed)", 0.0)]
    assert report["total"]["total_j"] == 1000.0


def test_by_day_the_rows_are_the_days_and_idle_is_part_of_them():
    report = _history().report(DAY1 - 3600, "day")
    assert [(r["name"], r["total_j"]) for r in report["rows"]] == [("2026-12-01", 3600.0), ("2026-12-02", 800.0)]
    assert not any(r.get("rest") for r in report["rows"])
    assert report["idle"]["total_j"] == 340.0 and report["unattributed"]["total_j"] == 200.0


def test_an_empty_history_has_no_rows():
    assert EnergyHistory().report(DAY1, "job")["rows"] == []
