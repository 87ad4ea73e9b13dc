"""Attribution end to end on the fake NVML with simulated processes: two jobs sharing one GPU, a job on two
GPUs, a job through a daemon restart. Totals add up to the device counters and no job is charged for
another's joules."""

from __future__ import annotations

import pytest

from tests.accounting.bench import FLOOR_W, Bench


def _adds_up(service, bench):
    devices = service.accountant.ledger.devices
    for dev in ("gpu0", "gpu1"):
        d = devices[dev]
        charged = sum(r.joules.get(dev, 0.0) for r in service.accountant.ledger.processes.values())
        assert charged + d["idle_j"] + d["unattributed_j"] == pytest.approx(d["total_j"], rel=1e-9)
    return devices


def test_two_jobs_sharing_one_gpu(tmp_path):
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    bench.job(5001, 101, {0: 3.0})
    bench.job(5002, 102, {0: 1.0})
    bench.util[0], bench.power["gpu0"] = 100.0, 400.0
    bench.run(20)
    jobs = service.processes_document()["groups"]["job"]
    assert jobs["slurm:101"]["gpu0"] == pytest.approx(bench.truth[(5001, "gpu0")], rel=0.02)
    assert jobs["slurm:102"]["gpu0"] == pytest.approx(bench.truth[(5002, "gpu0")], rel=0.02)
    # 20 s × (400 − 25) W active, 3:1, plus half the floor each
    assert jobs["slurm:101"]["gpu0"] == pytest.approx(20 * (375 * 0.75 + FLOOR_W / 2), rel=0.02)
    assert "gpu1" not in jobs["slurm:101"] and "gpu1" not in jobs["slurm:102"]
    devices = _adds_up(service, bench)
    assert devices["gpu1"]["idle_j"] == pytest.approx(20 * FLOOR_W)  # nobody on gpu1: its floor is idle
    gpu0 = service.processes_document()["gpus"]["gpu0"]
    assert gpu0["basis"] == "utilization"
    assert {p["pid"]: p["sm_pct"] for p in gpu0["processes"]} == {5001: 75.0, 5002: 25.0}
    # who may report a GPU's progress: the uids of its compute processes (their /proc status), none on gpu1
    assert (service.gpu_uids("gpu0"), service.gpu_uids("gpu1"), service.gpu_uids("gpu7")) == (
        frozenset({0}), frozenset(), None)


def test_an_idle_job_holding_memory_is_not_charged_for_a_busy_one(tmp_path):
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    bench.job(5001, 101, {0: 1.0}, memory_mib=1000)
    bench.job(5002, 102, {0: 0.0}, memory_mib=40000)  # holds most of the memory, computes nothing
    bench.util[0], bench.power["gpu0"] = 100.0, 400.0
    bench.run(10)
    jobs = service.processes_document()["groups"]["job"]
    assert jobs["slurm:102"]["gpu0"] == pytest.approx(10 * FLOOR_W / 2)  # its half of the floor, nothing more
    assert jobs["slurm:101"]["gpu0"] == pytest.approx(10 * (375 + FLOOR_W / 2))


def test_a_job_on_two_gpus(tmp_path):
    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    bench.job(6001, 201, {0: 1.0, 1: 1.0})  # one process on both GPUs
    bench.job(6002, 202, {1: 1.0})
    for i in (0, 1):
        bench.util[i], bench.power[f"gpu{i}"] = 100.0, 300.0
    bench.run(15)
    jobs = service.processes_document()["groups"]["job"]
    assert jobs["slurm:201"]["gpu0"] == pytest.approx(15 * 300.0)  # all of gpu0
    assert jobs["slurm:201"]["gpu1"] == pytest.approx(15 * 150.0)  # half of gpu1
    assert jobs["slurm:202"]["gpu1"] == pytest.approx(15 * 150.0) and "gpu0" not in jobs["slurm:202"]
    _adds_up(service, bench)


def test_a_job_through_a_daemon_restart(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    bench = Bench(tmp_path)
    bench.job(7001, 301, {0: 1.0})
    bench.job(7002, 302, {0: 1.0})
    bench.util[0], bench.power["gpu0"] = 100.0, 425.0
    service = bench.start_daemon(state)
    w301 = service.windows.start("slurm-301", 0.0, uid=0, scope="job:301")
    w302 = service.windows.start("slurm-302", 0.0, uid=0, scope="job:302")
    bench.truth.clear()
    bench.run(10)
    bench.stop_daemon()  # restarted by systemd: 7 s without a daemon, the jobs run on
    bench.run(7)
    service = bench.start_daemon(state)
    bench.run(10)
    r301 = service.windows.stop(w301, uid=0, name="slurm-301")
    r302 = service.windows.stop(w302, uid=0, name="slurm-302")
    assert r301["restarts"] == 1
    # each job has half of the 20 s the daemon watched; the 7 s it was down nobody watched who used the
    # GPU: counted in the device total, unattributed (attack8 T2), never charged to whoever holds it next
    assert r301["attributed"]["gpu0"] == pytest.approx(20 * 425.0 / 2, rel=1e-6)
    assert r302["attributed"]["gpu0"] == pytest.approx(20 * 425.0 / 2, rel=1e-6)
    assert r301["joules"]["gpu0"] == pytest.approx(27 * 425.0)  # the device total covers the whole 27 s
    history = service.report(0.0, "job")
    rows = {r["name"]: r for r in history["rows"]}
    assert rows["slurm:301"]["joules"]["gpu0"] == pytest.approx(20 * 425.0 / 2, rel=1e-6)
    assert service.accountant.ledger.devices["gpu0"]["unattributed_j"] == pytest.approx(7 * 425.0)


def test_a_stale_window_id_never_charges_another_job(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    bench = Bench(tmp_path)
    service = bench.start_daemon(state)
    old = service.windows.start("slurm-401", 0.0, uid=0, scope="job:401")
    service.windows.stop(old, uid=0, name="slurm-401")
    bench.stop_daemon()
    service = bench.start_daemon(state)
    new = service.windows.start("slurm-402", 0.0, uid=0, scope="job:402")
    assert new != old
    with pytest.raises(Exception, match="no open energy window"):
        service.windows.stop(old, uid=0, name="slurm-401")
    assert service.windows.list(0, root=True)[0]["name"] == "slurm-402"


def test_the_display_gpus_floor_is_learnt_while_the_compositor_holds_it(tmp_path):
    from aithermd.sim.processes import DESKTOP_CGROUP, SimProcess

    bench = Bench(tmp_path)
    service = bench.start_daemon(None)
    service.accountant.floors.clear()  # a fresh install: no floor known yet
    bench.procs.start(SimProcess(1850, "gnome-shell", ["/usr/bin/gnome-shell"], DESKTOP_CGROUP, uid=0,
                                 gpus={0: (300.0, 1.0)}, graphics=True))
    bench.util[0], bench.power["gpu0"] = 1.0, 22.0  # the desktop at 1 %: an idle card it holds for ever
    bench.run(20)
    assert service.gpu_uids("gpu0") == frozenset()  # a graphics process is no job: it reports no progress
    floor = service.accountant.floors[bench.nvml.gpu(0).uuid].value
    assert floor == pytest.approx(22.0)  # learnt while only the compositor held the card
    shell = service.accountant.ledger.processes
    (record,) = [r for r in shell.values() if r.info.pid == 1850]
    assert record.idle_j["gpu0"] > 0.5 * record.joules["gpu0"]  # once learnt, what it holds is idle floor
